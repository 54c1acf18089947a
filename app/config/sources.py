"""Where configuration values come from, and how a bad one is reported.

Precedence is pydantic-settings' own merge (`settings_customise_sources`):
environment > settings.json > config.toml > declared defaults. Our additions:

- `${VAR}` in settings.json expands from the environment; a missing variable is an
  error naming the file, the JSON path and the variable;
- `TOKENGATE_REDIS_URL` is a documented shorthand for `TOKENGATE_REDIS__URL`, and
  `TOKENGATE_DATABASE_URL` for `TOKENGATE_DATABASE__URL`;
- `TOKENGATE_API_KEY`, `TOKENGATE_CONFIG`, `TOKENGATE_SETTINGS` are not settings
  (the first is `tokengate check`'s *client* key and must never become the upstream key);
- a validation error is traced back to the source that supplied the value, so the
  message can say which file or variable to fix.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from app.config.blank import blank_secrets
from app.config.problems import ConfigError, Problem
from app.config.schema import Settings

ENV_PREFIX = "TOKENGATE_"
_NOT_SETTINGS = {"TOKENGATE_API_KEY", "TOKENGATE_CONFIG", "TOKENGATE_SETTINGS"}
_SHORTHANDS = {
    "TOKENGATE_REDIS_URL": "TOKENGATE_REDIS__URL",
    "TOKENGATE_DATABASE_URL": "TOKENGATE_DATABASE__URL",
}
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${VAR} in settings.json


@dataclass(frozen=True)
class ConfigFiles:
    config: Path
    settings: Path


def default_files(environ: Mapping[str, str] | None = None) -> ConfigFiles:
    env = os.environ if environ is None else environ
    return ConfigFiles(
        config=Path(env.get("TOKENGATE_CONFIG", "config/config.toml")),
        settings=Path(env.get("TOKENGATE_SETTINGS", "config/settings.json")),
    )


class GatewayEnvSource(EnvSettingsSource):
    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = {k.upper(): v for k, v in os.environ.items()}
        for short, full in _SHORTHANDS.items():
            if short in env and full not in env:
                env[full] = env.pop(short)
        for name in _NOT_SETTINGS:
            env.pop(name, None)
        return {k.lower(): v for k, v in env.items()}


def secret_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment, overlaid with `TOKENGATE_SECRETS_DIR` (one file per variable).

    Kubernetes and Docker mount secrets as files and update them in place; re-reading
    this directory on SIGHUP is how an upstream key is rotated without a restart (a
    process's own environment can not be changed from outside).
    """
    env = dict(os.environ if environ is None else environ)
    folder = env.get("TOKENGATE_SECRETS_DIR")
    if folder:
        for entry in sorted(Path(folder).glob("*")):
            if entry.is_file() and not entry.name.startswith("."):
                env[entry.name] = entry.read_text("utf-8").strip()
    return env


class ExpandingJsonSource(JsonConfigSettingsSource):
    """settings.json with `${VAR}` placeholders filled from the environment."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self.environ = environ  # read by _read_file, which the parent's __init__ calls
        super().__init__(settings_cls)

    def _read_file(self, file_path: Path) -> dict[str, Any]:  # type: ignore[override]
        data = super()._read_file(file_path)
        if not isinstance(data, dict):
            raise ConfigError(
                [
                    Problem(
                        str(file_path),
                        "-",
                        "must hold one JSON object",
                        "wrap the settings in { ... }",
                    )
                ]
            )
        expanded: dict[str, Any] = _expand(data, (), file_path, self.environ)
        return expanded


def _expand(value: Any, path: tuple[str | int, ...], file: Path, env: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, (*path, k), file, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*path, i), file, env) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        return PLACEHOLDER.sub(lambda m: _lookup(m.group(1), path, file, env), value)
    return value


def _lookup(name: str, path: tuple[str | int, ...], file: Path, env: Mapping[str, str]) -> str:
    found = env.get(name)
    if found is None or not found.strip():
        raise ConfigError(
            [
                Problem(
                    origin=str(file),
                    field=_dotted(path),
                    message=f"environment variable {name} is not set or is empty",
                    fix=f"export {name}=... in the gateway's environment (containers must "
                    "pass it explicitly, e.g. `docker run -e " + name + "`)",
                )
            ]
        )
    return found


class _FileBound(Settings):
    """Settings with its file sources wired in; subclassed per pair of paths."""

    model_config = SettingsConfigDict()
    environ: ClassVar[Mapping[str, str] | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            GatewayEnvSource(settings_cls),
            _json_source(cls),
            TomlConfigSettingsSource(settings_cls),
        )


def _json_source(cls: type[_FileBound]) -> ExpandingJsonSource:
    return ExpandingJsonSource(cls, cls.environ if cls.environ is not None else os.environ)


def load_settings(files: ConfigFiles, environ: Mapping[str, str] | None = None) -> Settings:
    """Load and validate; raise `ConfigError` listing every problem with its fix."""
    for path in (files.config, files.settings):
        if not path.is_file():
            raise ConfigError(
                [
                    Problem(
                        origin=str(path),
                        field="-",
                        message="file not found",
                        fix="pass --config/--settings (or TOKENGATE_CONFIG/TOKENGATE_SETTINGS) "
                        "naming an existing file",
                    )
                ]
            )
    bound = _bind(files, environ)
    try:
        settings: Settings = bound()
    except ValidationError as exc:
        raise ConfigError([_explain(err, files) for err in exc.errors()]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            [Problem(str(files.config), "-", f"not valid TOML: {exc}", "fix the syntax")]
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [
                Problem(
                    str(files.settings),
                    "-",
                    f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                    "fix the syntax",
                )
            ]
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [Problem("config files", "-", f"not UTF-8: {exc}", "save as UTF-8")]
        ) from None
    blank = blank_secrets(settings, lambda loc: _secret_origin(loc, files))
    if blank:
        raise ConfigError(blank)
    return settings


def _secret_origin(loc: tuple[str | int, ...], files: ConfigFiles) -> str:
    """Where a secret was set, by the name the operator used (a shorthand included)."""
    env = {k.upper() for k in os.environ}
    full = ENV_PREFIX + "__".join(str(p) for p in loc).upper()
    for short, long in _SHORTHANDS.items():
        if long == full and short in env and full not in env:
            return f"environment variable {short}"
    return _Origins(files).of(loc)


def _bind(files: ConfigFiles, environ: Mapping[str, str] | None) -> type[Settings]:
    config = SettingsConfigDict(toml_file=files.config, json_file=files.settings)
    bound: type[_FileBound] = type("BoundSettings", (_FileBound,), {"model_config": config})
    bound.environ = environ
    return bound


class _Origins:
    """The three raw layers, to say which one supplied a failing value."""

    names: ClassVar[tuple[str, ...]] = ("env", "json", "toml")

    def __init__(self, files: ConfigFiles) -> None:
        self.files = files
        self.toml = _safe(lambda: tomllib.loads(files.config.read_text("utf-8")))
        self.json = _safe(lambda: json.loads(files.settings.read_text("utf-8")))

    def of(self, loc: tuple[str | int, ...]) -> str:
        env_name = _env_name(loc)
        if env_name is not None:
            return f"environment variable {env_name}"
        if _has(self.json, loc):
            return str(self.files.settings)
        if _has(self.toml, loc):
            return str(self.files.config)
        return f"{self.files.settings} or {self.files.config}"


def _safe(read: Any) -> dict[str, Any]:
    try:
        data = read()
    except Exception:
        return {}
    return data if isinstance(data, dict) else {}


def _has(data: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False
    return True


def _env_name(loc: tuple[str | int, ...]) -> str | None:
    env = {k.upper() for k in os.environ}
    for short, full in _SHORTHANDS.items():
        if short in env:
            env.add(full)
    for depth in range(len(loc), 0, -1):
        parts = [p for p in loc[:depth] if isinstance(p, str)]
        if len(parts) != depth:
            continue
        name = ENV_PREFIX + "__".join(parts).upper()
        if name in env and name not in _NOT_SETTINGS:
            return name
    return None


def _explain(err: Any, files: ConfigFiles) -> Problem:
    loc = _clean_loc(tuple(err["loc"]))
    origin = _Origins(files).of(loc)
    field = _dotted(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        return Problem(origin, field, "unknown field", _unknown_fix(loc))
    if kind == "missing":
        return Problem(origin, field, "required field is missing", f"add `{field}`")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return Problem(origin, field, f"{err['msg']}{shown}", f"set `{field}` to a valid value")


def _clean_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    # A union (table | array) adds the branch name to the location; drop it.
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("list"))))


def _unknown_fix(loc: tuple[str | int, ...]) -> str:
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        nested = _model_of(field.annotation) if field else None
        if nested is None:
            return "remove it"
        model = nested
    known = sorted(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return f"{hint}remove it or use one of: {', '.join(known)}"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "-"
