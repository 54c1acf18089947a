"""From files and environment to a ready process: settings, runtime, logging.

Shared by the CLI (`serve`, `check`) and `main.factory` (each `--workers` process),
so every process validates the same way and fails with the same message.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from app.config.deprecated import warn_deprecated
from app.config.sources import ConfigFiles, default_files, load_settings, secret_environ
from app.log import setup_logging
from app.runtime import Runtime, compile_runtime

log = logging.getLogger("tokengate")


def load_runtime(
    files: ConfigFiles | None = None, *, no_auth: bool = False, workers: int = 1
) -> Runtime:
    files = files or default_files()
    environ = secret_environ()  # re-read on every (re)load: rotated secrets apply
    settings = load_settings(files, environ)
    return compile_runtime(
        settings,
        environ,
        no_auth=no_auth,
        workers=workers,
        source=f"{files.settings} / {files.config}",
        files=(str(files.config), str(files.settings)),
    )


def secrets_of(runtime: Runtime) -> list[str]:
    s = runtime.settings
    found = [d.api_key.get_secret_value() for d in runtime.domains]
    # an upstream URL's userinfo (`user:password@`): a log line may quote the URL whole
    found += [userinfo(d.api_base) for d in runtime.domains if "@" in d.api_base]
    if s.admin_key is not None:
        found.append(s.admin_key.get_secret_value())
    if s.api_key is not None:
        found.append(s.api_key.get_secret_value())
    if s.redis.url is not None and "@" in s.redis.url.get_secret_value():
        found.append(s.redis.url.get_secret_value())
        target = s.redis.target()
        if target is not None and target.password:
            found.append(target.password)  # the password alone, wherever a message puts it
    for secret in (s.redis.password, s.redis.sentinel_password, s.metrics.token):
        if secret is not None:
            found.append(secret.get_secret_value())
    if s.database.url is not None:
        from app.db.url import url_secrets

        found.extend(url_secrets(s.database.url.get_secret_value()))
    if s.tracing.headers is not None:  # a tracing service's key, and each header value
        raw = s.tracing.headers.get_secret_value()
        found += [raw, *(v.partition("=")[2].strip() for v in raw.split(","))]
    return found


def userinfo(url: str) -> str:
    """What stands before a URL's last `@` (after its scheme): the credentials part."""
    rest = url.partition("://")[2] or url
    return rest[: rest.rfind("@")]


def reload_runtime(current: Runtime) -> Runtime:
    """The runtime from the same files as `current`; raises `ConfigError` if invalid."""
    assert current.files is not None, "this runtime was not loaded from files"
    config, settings = current.files
    return load_runtime(
        ConfigFiles(Path(config), Path(settings)),
        no_auth=not current.auth_enabled,
        workers=current.workers,
    )


def setup_process(runtime: Runtime) -> None:
    setup_logging(runtime.settings.logging, secrets_of(runtime), runtime.source)
    warn_deprecated(runtime.settings)  # once the log is open, once per process
    if not runtime.auth_enabled:
        warning = (
            "AUTHENTICATION IS OFF (--no-auth): anyone who can reach this port can spend "
            "the upstream quota. Use only on a trusted network."
        )
        log.warning(warning)
        print(f"tokengate: WARNING: {warning}", file=sys.stderr)  # noqa: T201
