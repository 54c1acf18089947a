"""What changed between two configurations, setting by setting, safe to log.

A reload (SIGHUP) names every change: applied live, or waiting for a restart (which
is which is declared once, in `app.config.effects`). Sections are compared field by
field (`token_scheduler.batch_size`); lists and mappings (`keys`, `model_aliases`, a
`[[scale_up]]` array) as one value each. Only plain scalars are shown: a secret, a
list of key digests or a mapping is reported as changed, never printed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, SecretStr

from app.config.schema import Settings

_SHOWN = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Change:
    path: str
    old: object
    new: object

    def shown(self) -> str:
        if isinstance(self.old, _SHOWN) and isinstance(self.new, _SHOWN):
            return f"{self.path} {_show(self.old)} -> {_show(self.new)}"
        return f"{self.path} (changed)"


def changes(old: Settings, new: Settings) -> list[Change]:
    """Every setting whose value differs, in schema order."""
    return list(_walk("", old, new))


def _walk(prefix: str, old: object, new: object) -> Iterator[Change]:
    # Same fields, not the same class: each load binds its own subclass of `Settings`.
    if (
        isinstance(old, BaseModel)
        and isinstance(new, BaseModel)
        and type(old).model_fields.keys() == type(new).model_fields.keys()
    ):
        for name in type(old).model_fields:
            yield from _walk(f"{prefix}{name}.", getattr(old, name), getattr(new, name))
        return
    if _value(old) != _value(new):
        yield Change(prefix.rstrip("."), old, new)


def _value(value: object) -> object:
    """A comparable form: secrets by their value, models and containers recursively."""
    if isinstance(value, SecretStr):
        return ("secret", value.get_secret_value())
    if isinstance(value, BaseModel):
        return (type(value).__name__, _value(value.model_dump()))
    if isinstance(value, Mapping):
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    return value


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)
