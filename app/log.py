"""Structured logs: one JSON object per line, secrets redacted before any handler.

`setup_logging` points the `tokengate` loggers at `logging.output` (a file path,
`stdout` or `stderr`). A missing or unwritable log directory is a startup error
(exit 2), never a silent fallback. The redaction filter replaces every registered
secret (upstream keys, admin key) and anything shaped like a bearer token or API key
with `***`; prompt text never reaches the log (`logging.log_prompts` is deprecated and
ignored).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from app.config.problems import ConfigError, Problem
from app.config.schema import LoggingConfig

_TOKEN_SHAPES = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}|\b(sk|tg|tk)-[A-Za-z0-9_-]{8,}")
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "fields"}


class Redactor(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: set[str] = {s for s in secrets if len(s) >= 4}

    def add(self, secret: str) -> None:
        if len(secret) >= 4:
            self.secrets.add(secret)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return _TOKEN_SHAPES.sub(lambda m: (m.group(1) or "") + "***", text)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.scrub(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = {k: self._scrub_value(v) for k, v in fields.items()}
        return True

    def _scrub_value(self, value: object) -> object:
        return self.scrub(value) if isinstance(value, str) else value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = v
        if record.exc_text:
            out["exc"] = record.exc_text
        return orjson.dumps(out, default=str).decode()


def redacted_url(url: str) -> str:
    """A URL fit for an operator's eyes: the one function every URL shown goes through
    (banner, logs, `/health/ready`, `/admin/status`, the status page, `check`, the
    database's name in errors).

    The password becomes `***` (`user:***@`), a userinfo without one (which may be a
    token) `***@`, and each query value `***`. A password with an unencoded `/`, `?`,
    `#` or `@` makes the authority ambiguous, so everything before the last `@` is
    userinfo and everything after its first `:` password: a path holding `@` loses some
    of its text on display, but no part of a password is ever shown."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    shown = ""
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        safe = colon and user and not any(c in user for c in "/?#@")
        shown = f"{user}:***@" if safe else "***@"
        rest = rest[at + 1 :]
    head, q, query = rest.partition("?")
    if q:
        query = "&".join(f"{p.partition('=')[0]}=***" for p in query.split("&"))
    shown += head + (f"?{query}" if q else "")
    return f"{scheme}://{shown}" if sep else shown


def output_problem(output: str, source: str) -> Problem | None:
    """Why `logging.output` can not be written, or None: the one check `serve` makes at
    start and `tokengate check` makes ahead of it."""
    if output in ("stdout", "stderr"):
        return None
    path = Path(output)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return Problem(
            source,
            "logging.output",
            f"directory {parent} does not exist",
            "create it, or set logging.output to stdout/stderr (TOKENGATE_LOGGING__OUTPUT=stderr)",
        )
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return Problem(
            source,
            "logging.output",
            f"{path} is not writable",
            "fix its permissions, or set logging.output to stdout/stderr",
        )
    return None


def _stream_for(output: str, source: str) -> logging.Handler:
    if output == "stdout":
        return logging.StreamHandler(sys.stdout)
    if output == "stderr":
        return logging.StreamHandler(sys.stderr)
    problem = output_problem(output, source)
    if problem is not None:
        raise ConfigError([problem])
    return logging.FileHandler(Path(output), encoding="utf-8")


def setup_logging(cfg: LoggingConfig, secrets: Iterable[str], source: str) -> Redactor:
    handler = _stream_for(cfg.output, source)
    redactor = Redactor(secrets)
    handler.addFilter(redactor)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("tokengate")
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(cfg.level.upper())
    root.propagate = False
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers = [handler]
        lg.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # our access line replaces it
    return redactor
