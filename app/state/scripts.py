"""Lua scripts: where each one's text lives, with the constants it shares with Python
written in at load time.

A script lives beside the Python that speaks to it (`app/limits/token_bucket.lua`,
`app/billing/budget.lua`, `app/state/replicas.lua`, ...); a `Script` names it by package
and file. A script says `-- @constants` on a line of its own; that line becomes one `local
NAME = value` per constant the script was declared with, so each number is typed once,
in Python (`app/limits/constants.py`), and the script can not drift from it by a typo.
The engine's link (`link.py`) runs scripts by SHA and loads them when Redis lacks them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

MARKER = "-- @constants"


@dataclass(frozen=True, eq=False)
class Script:
    """One Lua script (compared by identity: each is declared once, at module level)."""

    package: str
    name: str
    constants: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, package: str, name: str, constants: Mapping[str, float] | None = None) -> Script:
        return cls(package, name, tuple((constants or {}).items()))

    def source(self) -> str:
        """The text of `<package>/<name>`, constants filled in."""
        text = resources.files(self.package).joinpath(self.name).read_text("utf-8")
        if self.constants and MARKER not in text:
            raise RuntimeError(f"{self.name} lacks its {MARKER!r} line")
        lines = "\n".join(f"local {n} = {_lua_number(v)}" for n, v in self.constants)
        return text.replace(MARKER, lines, 1)

    def sha(self) -> str:
        return hashlib.sha1(self.source().encode(), usedforsecurity=False).hexdigest()


def _lua_number(value: float) -> str:
    # repr() round-trips a float exactly; Lua reads the same literal (1e-05, 0.98, 60.0).
    return repr(value)
