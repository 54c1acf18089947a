"""The Lua scripts, with the constants they share with Python written in at load time.

A script says `-- @constants` on a line of its own; that line becomes one `local NAME =
value` per constant the script uses (`constants.PACE_LUA`, `BUCKET_LUA`, `REPLICAS_LUA`), so
`constants.py` is the one place those numbers are typed.
"""

from __future__ import annotations

from importlib import resources

from app.limits import constants

MARKER = "-- @constants"
_SHARED = {
    "pace.lua": constants.PACE_LUA,
    "token_bucket.lua": constants.BUCKET_LUA,
    "replicas.lua": constants.REPLICAS_LUA,
}


def script(name: str) -> str:
    """The source of `app/limits/<name>`, constants filled in."""
    text = resources.files("app.limits").joinpath(name).read_text("utf-8")
    names = _SHARED.get(name, ())
    if names and MARKER not in text:
        raise RuntimeError(f"{name} lacks its {MARKER!r} line")
    lines = "\n".join(f"local {n} = {_lua_number(getattr(constants, n))}" for n in names)
    return text.replace(MARKER, lines, 1)


def _lua_number(value: float) -> str:
    # repr() round-trips a float exactly; Lua reads the same literal (1e-05, 0.98, 60.0).
    return repr(value)
