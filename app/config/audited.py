"""What a reload changed, as audit entries: (action, target, before, after).

Keys, teams, prices and windows are compared one by one, so the trail says "key
`alice` changed" with both versions, not "keys (changed)". A key's `key_sha256` is never
written (a digest is not a secret, but the trail has no use for it): it is replaced by a
short fingerprint of the digests, so a rotation shows as a changed fingerprint. Every
other changed setting is one `setting.changed` entry; a secret (`admin_key`, `api_key`)
is written as `"(secret)"`, and a value that is not a plain scalar is written whole only
if it holds no secret.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, SecretStr

from app.config.diff import changes
from app.config.schema import Settings

Entry = tuple[str, str, object, object]
# Paths compared entity by entity: (path, action prefix, target prefix, name of an entity)
_ENTITIES = (
    ("keys", "key", "key", "alias"),
    ("teams", "team", "team", "name"),
    ("billing.prices", "price", "model", None),
    ("billing.windows", "window", "window", None),
)


def config_changes(old: Settings, new: Settings) -> list[Entry]:
    out: list[Entry] = []
    for change in changes(old, new):
        entity = next((e for e in _ENTITIES if change.path == e[0]), None)
        if entity is None:
            out.append(("setting.changed", change.path, _plain(change.old), _plain(change.new)))
            continue
        _, action, kind, name = entity
        out.extend(_entities(action, kind, _by_name(change.old, name), _by_name(change.new, name)))
    return out


def _by_name(value: object, name: str | None) -> dict[str, dict[str, Any]]:
    if isinstance(value, Mapping):
        return {str(k): _dump(v) for k, v in value.items()}
    items = value if isinstance(value, list | tuple) else []
    return {str(getattr(item, name or "")): _dump(item) for item in items}


def _dump(item: object) -> dict[str, Any]:
    data = item.model_dump(mode="json") if isinstance(item, BaseModel) else {"value": item}
    if "key_sha256" in data:
        digests = data["key_sha256"]
        joined = ",".join(digests if isinstance(digests, list) else [str(digests)])
        data["key_sha256"] = "fingerprint:" + hashlib.sha256(joined.encode()).hexdigest()[:12]
    return data


def _entities(
    action: str, kind: str, old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]
) -> Iterator[Entry]:
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before is None:
            yield (f"{action}.added", f"{kind}:{name}", None, after)
        elif after is None:
            yield (f"{action}.removed", f"{kind}:{name}", before, None)
        elif before != after:
            yield (f"{action}.changed", f"{kind}:{name}", before, after)


def _plain(value: object) -> object:
    if isinstance(value, SecretStr):
        return "(secret)"
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = repr(value)
    return "(changed)" if "SecretStr" in text or "secret" in text.lower() else _jsonable(value)


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)
