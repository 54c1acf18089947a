"""The configuration reference (docs/configuration.md), generated from the declared models.

Every field of `Settings` becomes a row: its dotted name, the environment variable
that overrides it, its default and its description. `tokengate config-reference` prints
it; `make docs` splices it into `DOC` between the two markers, and `tests/unit/config`
fails when that copy drifts from this output.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.config.schema import ScaleUpConfig, Settings
from app.config.variables import OUTSIDE

DOC = "docs/configuration.md"
BEGIN = "<!-- config-reference:begin -->"
END = "<!-- config-reference:end -->"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(section)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        return "unset"
    return f"`{json.dumps(value)}`"


def _nested(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _items(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """A list of sections (`keys[]`) or a map of them (`billing.prices.<model>`)."""
    args: tuple[Any, ...] = getattr(annotation, "__args__", ())
    origin = getattr(annotation, "__origin__", None)
    item = _nested(args[-1]) if args else None
    if item is None:
        return None
    if origin is list:
        return "[]", item
    if origin is dict:
        return ".<name>", item
    return None


def _item_rows(model: type[BaseModel], prefix: str, env: str) -> list[str]:
    """Rows of the fields inside a JSON list or map, set through its variable."""
    rows: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        items = _items(field.annotation)
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{dotted}` | (in {env}) | {_default(field)} | {desc} |")
        if items is not None:
            rows += _item_rows(items[1], dotted + items[0] + ".", env)
    return rows


def _rows(model: type[BaseModel], prefix: str, env_prefix: str) -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        env = f"{env_prefix}{name.upper()}"
        nested = _nested(field.annotation)
        if nested is not None:
            rows += _rows(nested, dotted + ".", env + "__")
            continue
        if dotted == "scale_up":
            rows.append(f"| `scale_up` | `{env}` (JSON) | unset | {field.description} |")
            rows += _rows(ScaleUpConfig, "scale_up[].", env + "__")
            continue
        items = _items(field.annotation)
        if items is not None and env_prefix:
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{dotted}` | `{env}` (JSON) | {_default(field)} | {desc} |")
            rows += _item_rows(items[1], dotted + items[0] + ".", f"`{env}`")
            continue
        if items is not None:  # in a `[[scale_up]]` entry: a map of sections (`headers`)
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{dotted}` | (per domain) | {_default(field)} | {desc} |")
            rows += _item_rows(items[1], dotted + items[0] + ".", "the domain's entry")
            continue
        if dotted == "api_key":
            env = "(not settable: `${VAR}` in settings.json)"
        elif prefix == "scale_up[].":
            env = f"`{env}` (single-table form)"
        else:
            env = f"`{env}`"
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{dotted}` | {env} | {_default(field)} | {desc} |")
    return rows


def render() -> str:
    head = ["| field | environment variable | default | meaning |", "|---|---|---|---|"]
    outside = [
        "",
        "Read outside the settings (any other `TOKENGATE_*` variable is reported at start "
        "and by `tokengate check`, with the nearest name):",
        "",
        "| environment variable | read as |",
        "|---|---|",
        *(f"| `{name}` | {what} |" for name, what in OUTSIDE.items()),
    ]
    return "\n".join([*head, *_rows(Settings, "", "TOKENGATE_"), *outside])


def splice(doc: str) -> str:
    """`DOC`'s text with the reference block replaced by the current one."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + "\n" + render() + "\n" + doc[end:]
