"""A secret that is set but empty or blank enables nothing: it stops the start.

An empty Compose variable, an empty value in a Kubernetes Secret the manifest marks
`optional`, a secrets-directory file holding only a newline: each sets a secret to ""
or whitespace. Read as "set", an empty admin key would turn the admin API on with no
password, an empty scrape token would guard `/metrics` with nothing. So every
`SecretStr` anywhere in the settings (found by walking the models, so a secret added
later is covered without a list to keep in step) must be either absent or hold
something other than whitespace; the problem names where it was set, never its value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pydantic import BaseModel, SecretStr

from app.config.problems import Problem

Loc = tuple[str | int, ...]


def blank_secrets(settings: BaseModel, origin_of: Callable[[Loc], str]) -> list[Problem]:
    return [
        Problem(
            origin_of(loc),
            _dotted(loc),
            "is set but empty or blank; an empty secret never enables anything",
            "give it a value, or unset the variable (remove the field) to leave it off",
        )
        for loc in _blank(settings, ())
    ]


def _blank(model: BaseModel, loc: Loc) -> Iterator[Loc]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        here = (*loc, name)
        if isinstance(value, SecretStr):
            if not value.get_secret_value().strip():
                yield here
        elif isinstance(value, BaseModel):
            yield from _blank(value, here)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _blank(item, (*here, i))


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
