"""Every `TOKENGATE_*` variable tokengate reads, declared once, and the ones it does not.

Two kinds: the settings model's (`TOKENGATE_<SECTION>__<FIELD>`, derived from the
declared models, so they can not drift) and those read elsewhere (`OUTSIDE`: the CLI's
defaults, file paths, shorthands, the client key of `check`). A variable in neither is
a typo or a setting of another tool: pydantic-settings ignores it, so `serve` and
`check` name it, with the nearest name they do read (`unread`). The reference lists
both kinds (`app.config.reference`); a test compares it with this module.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from app.config.schema import ScaleUpConfig, Settings

PREFIX = "TOKENGATE_"

# Read outside the settings model: name -> who reads it (shown in the reference).
OUTSIDE: dict[str, str] = {
    "TOKENGATE_CONFIG": "the path of config.toml (`--config`); default `config/config.toml`",
    "TOKENGATE_SETTINGS": "the path of settings.json (`--settings`); default "
    "`config/settings.json`",
    "TOKENGATE_HOST": "`serve` / `check` `--host` default (`127.0.0.1`)",
    "TOKENGATE_PORT": "`serve` / `check` `--port` default (`8080`)",
    "TOKENGATE_WORKERS": "`serve --workers` default (`1`)",
    "TOKENGATE_NO_AUTH": "set by `serve --no-auth` for its worker processes",
    "TOKENGATE_SECRETS_DIR": "a directory of secret files, one variable per file (re-read "
    "on SIGHUP)",
    "TOKENGATE_REDIS_URL": "shorthand of `TOKENGATE_REDIS__URL`",
    "TOKENGATE_DATABASE_URL": "shorthand of `TOKENGATE_DATABASE__URL`",
    "TOKENGATE_API_KEY": "the gateway key `check --target` sends (never the upstream key)",
    "TOKENGATE_URL": "`usage --target` default (`http://127.0.0.1:8080`)",
    "TOKENGATE_SIM_API_KEY": "the only key `tokengate sim` accepts (unset: any); "
    "`serve --upstream sim` sends it",
    "TOKENGATE_ALERTS_SECRET": "the spend-alert webhooks' HMAC-SHA256 secret, read from "
    "the variable `alerts.secret_env` names (this one by default)",
    "TOKENGATE_CLAUDE_BIN": "tests only: the Claude Code binary the agent tests run",
    "TOKENGATE_COMPILE": "build only: `1` compiles the request's path with mypyc "
    "(`setup.py`; `make compiled`, the image)",
    "TOKENGATE_TEST_BUILD": "tests only: a directory a build is installed in; the tests "
    "start their gateways and sims from it (`make test-compiled`)",
    "TOKENGATE_BENCH_LITELLM_VENV": "benchmarks only: where LiteLLM is installed",
}


def _model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _names(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, bool]]:
    """(variable, open): open when deeper `__` names below it are read too (a JSON list
    or map whose items pydantic-settings can also take one by one)."""
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        if env in OUTSIDE:  # `api_key`: TOKENGATE_API_KEY is check's client key instead
            continue
        nested = _model(field.annotation)
        if nested is not None:  # (the whole section as JSON is read too: `_sections`)
            yield from _names(nested, env + "__")
        elif env == PREFIX + "SCALE_UP":
            yield env, False
            yield from _names(ScaleUpConfig, env + "__")  # the single-table form
        else:
            origin = getattr(field.annotation, "__origin__", None)
            yield env, origin in (list, dict)


def settings_variables() -> dict[str, bool]:
    """Every variable the settings model reads -> whether deeper names are read too."""
    return dict(_names(Settings, PREFIX))


def _sections(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """Sections, each settable whole as one JSON object (`TOKENGATE_REDIS='{...}'`)."""
    for name, field in model.model_fields.items():
        nested = _model(field.annotation)
        if nested is not None:
            yield f"{prefix}{name.upper()}"
            yield from _sections(nested, f"{prefix}{name.upper()}__")


def known() -> set[str]:
    return set(settings_variables()) | set(OUTSIDE)


def is_read(name: str) -> bool:
    name = name.upper()
    variables = settings_variables()
    if name in variables or name in OUTSIDE or name in set(_sections(Settings, PREFIX)):
        return True
    return any(open_ and name.startswith(v + "__") for v, open_ in variables.items())


def unread(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(variable, nearest read name or None) for each `TOKENGATE_*` nobody reads."""
    names = sorted(known())
    return [
        (name, nearest(name, names))
        for name in sorted(environ)
        if name.upper().startswith(PREFIX) and not is_read(name)
    ]


# Names other tools use for what tokengate calls otherwise.
_MEANT = {
    "APIBASE": "TOKENGATE_API_ENDPOINT",
    "BASEURL": "TOKENGATE_API_ENDPOINT",
    "UPSTREAM": "TOKENGATE_API_ENDPOINT",
    "UPSTREAMURL": "TOKENGATE_API_ENDPOINT",
    "LOGLEVEL": "TOKENGATE_LOGGING__LEVEL",
}


def _flat(name: str) -> str:
    return name.upper().removeprefix(PREFIX).replace("_", "")


def nearest(name: str, names: list[str]) -> str | None:
    """The read name `name` most likely meant: another tool's name for it (`API_BASE`),
    the same letters with other underscores (`LOGGING_OUTPUT`), else the shortest one
    ending the same way, else the closest spelling."""
    flat = _flat(name)
    if flat in _MEANT:
        return _MEANT[flat]
    by_flat = {_flat(n): n for n in names}
    if flat in by_flat:
        return by_flat[flat]
    tails = sorted((n for n in names if _flat(n).endswith(flat) and flat), key=len)
    if tails:
        return tails[0]
    close = difflib.get_close_matches(flat, list(by_flat), n=1, cutoff=0.6)
    return by_flat[close[0]] if close else None


def warnings(environ: Mapping[str, str]) -> list[str]:
    """One line per unread variable, for `serve`'s start and `check`."""
    lines = []
    for name, close in unread(environ):
        hint = f"; did you mean {close}?" if close else ""
        lines.append(f"{name} is set, but tokengate reads no such variable (ignored){hint}")
    return lines
