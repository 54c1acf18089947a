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
_SCALARS = frozenset({int, float, bool})
_SHAPE_WORDS = ("bearer", "sk-", "tg-", "tk-")  # what every match of _TOKEN_SHAPES holds
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

    def clean(self, text: str) -> bool:
        """Whether `scrub` would leave `text` as it is. Every match of the key shapes
        holds one of `_SHAPE_WORDS` in some case, and looking for those costs a tenth of
        the pattern's case-blind search, which runs only when one is there. `casefold`,
        not `lower`: the pattern's IGNORECASE also takes the long s (U+017F) for `s` and
        the Kelvin sign for `k`, and only `casefold` maps them so."""
        if any(secret in text for secret in self.secrets):
            return False
        folded = text.casefold()
        if not any(word in folded for word in _SHAPE_WORDS):
            return True
        return _TOKEN_SHAPES.search(text) is None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.msg, record.args = message, None
        if record.exc_info:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        fields = getattr(record, "fields", None)
        texts = [message]
        if isinstance(fields, dict):
            _strings(fields.values(), texts)
        # One search over every text of the record (NUL-joined: neither a secret nor a
        # key shape spans a NUL) instead of one per value: the access line has some
        # twenty values and they are almost always clean (deploy/BENCHMARKS.md, issue
        # #32's seventh pass). A hit scrubs value by value, as before.
        if self.clean("\x00".join(texts)):
            return True
        record.msg = self.scrub(message)
        if isinstance(fields, dict):
            record.fields = {k: self._scrub_value(v) for k, v in fields.items()}
        return True

    def _scrub_value(self, value: object) -> object:
        """A value with every string in it scrubbed, in lists and mappings too (the
        access line's `attempts` are a list of mappings)."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {k: self._scrub_value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._scrub_value(v) for v in value]
        return value


def _strings(values: Iterable[object], into: list[str]) -> None:
    for value in values:
        if value is None or type(value) in _SCALARS:
            continue  # most of an access line: one test, not three
        if isinstance(value, str):
            into.append(value)
        elif isinstance(value, dict):
            _strings(value.values(), into)
        elif isinstance(value, (list, tuple)):
            _strings(value, into)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1  # the second `_stamp` spells: most lines share it with the last
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        out: dict[str, object] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.__dict__.keys() - _RESERVED:  # `extra=` beyond `fields`: rare
            for k, v in record.__dict__.items():
                if k not in _RESERVED and not k.startswith("_"):
                    out[k] = v
        if record.exc_text:
            out["exc"] = record.exc_text
        return orjson.dumps(out, default=str).decode()


def log_fields(logger: logging.Logger, msg: str, fields: dict[str, object]) -> None:
    """`logger.info(msg, extra={"fields": fields})` for a caller that checked
    `isEnabledFor(INFO)`, without `Logger.findCaller`'s walk up the stack: it finds the
    record's file and line, which no line of ours prints, and was 7 % of what an access
    line cost under cProfile (deploy/BENCHMARKS.md, issue #32's seventh pass)."""
    record = logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0, msg, (), None)
    record.fields = fields
    logger.handle(record)


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
