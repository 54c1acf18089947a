"""`serve --upstream sim | sim:PORT | URL`: the variables pointing a gateway at an upstream.

Pure: given the flag, the two files and the environment, the variables to add. The CLI
sets them in its own environment before loading, so precedence stays the documented
one (environment > files), and `--workers` processes and SIGHUP reloads see the same.

- a URL: `TOKENGATE_API_ENDPOINT` (every domain without its own `api_base`);
- `sim` (`tokengate sim` on its default `127.0.0.1:9090`) or `sim:PORT`: the same, and
  what a trial against the simulator needs where the user set nothing: the domain speaks
  both dialects (single-table form), the upstream key is `$TOKENGATE_SIM_API_KEY` (the
  sim's own; unset, the sim takes any key), and logs go to stderr (the seed's log
  directory, `/var/log/supernode`, rarely exists on a workstation).

A variable the user set always wins; a gateway key (or `--no-auth`) is still needed.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

from app.config.sources import PLACEHOLDER, ConfigFiles

SIM_PORT = 9090


def endpoint(value: str) -> tuple[str, bool]:
    """(upstream URL, whether it is the simulator) of the flag's value."""
    if value == "sim" or value.startswith("sim:"):
        port = value.partition(":")[2] or str(SIM_PORT)
        if not port.isdigit():
            raise ValueError(f"--upstream {value}: expected sim, sim:PORT or a URL")
        return f"http://127.0.0.1:{port}", True
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"--upstream {value}: expected sim, sim:PORT or an http(s):// URL")
    return value, False


def _read(files: ConfigFiles) -> tuple[dict[str, Any], dict[str, Any]]:
    def load(read: Any) -> dict[str, Any]:
        try:
            data = read()
        except (OSError, ValueError):
            return {}  # the loader reports a broken file, naming it
        return data if isinstance(data, dict) else {}

    toml = load(lambda: tomllib.loads(files.config.read_text("utf-8")))
    settings = load(lambda: json.loads(files.settings.read_text("utf-8")))
    return toml, settings


def key_variables(files: ConfigFiles) -> set[str]:
    """The variables the upstream keys come from: `${VAR}` in settings.json's `api_key`,
    `token_scheduler.api_key_env` and every domain's `api_key_env`."""
    toml, settings = _read(files)
    names = set(PLACEHOLDER.findall(str(settings.get("api_key", ""))))
    for source in (toml, settings):
        scheduler = source.get("token_scheduler")
        if isinstance(scheduler, dict) and isinstance(scheduler.get("api_key_env"), str):
            names.add(scheduler["api_key_env"])
        domains = source.get("scale_up")
        for entry in domains if isinstance(domains, list) else [domains]:
            if isinstance(entry, dict) and isinstance(entry.get("api_key_env"), str):
                names.add(entry["api_key_env"])
    return names or {"TAOTOKEN_API_KEY"}


def variables(value: str, files: ConfigFiles, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables `--upstream value` adds to `environ` (none the user set)."""
    url, sim = endpoint(value)
    added = {"TOKENGATE_API_ENDPOINT": url}
    if sim:
        toml, settings = _read(files)
        if not any(isinstance(s.get("scale_up"), list) for s in (toml, settings)):
            added["TOKENGATE_SCALE_UP__API_STYLE"] = "both"
        key = environ.get("TOKENGATE_SIM_API_KEY") or "sk-sim-any-key"
        added |= dict.fromkeys(sorted(key_variables(files)), key)
        added["TOKENGATE_LOGGING__OUTPUT"] = "stderr"
    return {k: v for k, v in added.items() if not environ.get(k) or k == "TOKENGATE_API_ENDPOINT"}
