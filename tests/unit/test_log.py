"""The log redactor: no secret reaches a handler, whatever shape it takes in a record."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.config.problems import ConfigError
from app.config.schema import LoggingConfig
from app.log import JsonFormatter, Redactor, log_fields, redacted_url, setup_logging


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.makeLogRecord({"name": "tokengate.t", "msg": msg, "args": args or None})
    rec.__dict__.update(extra)
    return rec


def through(redactor: Redactor, rec: logging.LogRecord) -> dict[str, object]:
    assert redactor.filter(rec) is True  # redacts, never drops
    out: dict[str, object] = json.loads(JsonFormatter().format(rec))
    return out


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("upstream key upstream-secret-42 refused", "upstream key *** refused"),
        ("Authorization: Bearer abcdef123456", "Authorization: Bearer ***"),
        ("client sent sk-proj_0123456789abc", "client sent ***"),
        ("gateway key tg-ABCDEFGH1234", "gateway key ***"),
        ("sk-short and bearer abc stay", "sk-short and bearer abc stay"),  # too short to be keys
    ],
)
def test_registered_secrets_and_key_shapes_become_stars(text: str, scrubbed: str) -> None:
    assert Redactor(["upstream-secret-42"]).scrub(text) == scrubbed


def test_secrets_shorter_than_four_characters_are_not_registered() -> None:
    redactor = Redactor(["abc"])
    redactor.add("xy")
    assert redactor.secrets == set()
    redactor.add("long-enough")
    assert redactor.scrub("a long-enough b") == "a *** b"


def test_arguments_are_formatted_before_scrubbing() -> None:
    out = through(Redactor(["hunter2-secret"]), record("key=%s user=%s", "hunter2-secret", "bo"))
    assert out["msg"] == "key=*** user=bo"


def test_tracebacks_and_structured_fields_are_scrubbed() -> None:
    try:
        raise ValueError("failed with sk-live-0123456789abcdef")
    except ValueError as exc:
        rec = record("boom", fields={"key": "sk-live-0123456789abcdef", "n": 3})
        rec.exc_info = (type(exc), exc, exc.__traceback__)
    out = through(Redactor(), rec)
    assert "sk-live" not in json.dumps(out)
    assert (
        out["key"] == "***" and out["n"] == 3 and "ValueError: failed with ***" in str(out["exc"])
    )


def test_a_missing_log_directory_is_a_config_error(tmp_path: Path) -> None:
    cfg = LoggingConfig.model_validate({"output": str(tmp_path / "nowhere" / "gw.log")})
    with pytest.raises(ConfigError) as err:
        setup_logging(cfg, [], "config.toml")
    assert "logging.output" in err.value.render()


@pytest.fixture
def loggers() -> Iterator[None]:
    """`setup_logging` rewires the process's loggers: put them back after the test."""
    names = ("tokengate", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {
        n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate) for n in names
    }
    level, disabled = (
        logging.getLogger("tokengate").level,
        logging.getLogger("uvicorn.access").disabled,
    )
    yield
    for name, (handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers, logger.propagate = handlers, propagate
    logging.getLogger("tokengate").setLevel(level)
    logging.getLogger("uvicorn.access").disabled = disabled


@pytest.mark.usefixtures("loggers")
def test_the_file_handler_writes_redacted_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "gw.log"
    cfg = LoggingConfig.model_validate({"output": str(path), "level": "info"})
    setup_logging(cfg, ["upstream-secret-42"], "config.toml")
    logger = logging.getLogger("tokengate.test")
    logger.info("calling with upstream-secret-42", extra={"fields": {"domain": "d"}})
    for handler in logging.getLogger("tokengate").handlers:
        handler.flush()
    (line,) = path.read_text().splitlines()
    out = json.loads(line)
    assert out["msg"] == "calling with ***" and out["domain"] == "d"
    assert out["level"] == "info" and out["logger"] == "tokengate.test"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("http://user:pw@h:8080/api", "http://user:***@h:8080/api"),
        ("http://token@h/api", "http://***@h/api"),  # a lone user part can be the secret
        ("postgresql://gw:pA@pB:pC@db:5432/tg", "postgresql://gw:***@db:5432/tg"),
        ("http://u:pa/ss@h/p", "http://u:***@h/p"),  # an unencoded `/` in the password
        ("http://h/a@b:c@d/p", "http://***@d/p"),  # ambiguous: nothing before `@` shown
        ("https://h/v1?api_key=abc&x=1", "https://h/v1?api_key=***&x=***"),
        ("user:pw@proxy:3128", "user:***@proxy:3128"),
    ],
)
def test_one_function_shows_every_url_without_its_credentials(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_an_upstream_urls_credentials_are_registered_with_the_redactor() -> None:
    from app.bootstrap import userinfo

    assert userinfo("http://svc:pw-9Zq@10.0.0.1:9/v1") == "svc:pw-9Zq"
    assert userinfo("https://gw:a@b:c@h/x") == "gw:a@b:c"  # an unencoded `@` in it too
    scrubbed = Redactor([userinfo("http://svc:pw-9Zq@10.0.0.1:9")]).scrub(
        "probe of http://svc:pw-9Zq@10.0.0.1:9/v1/models failed"
    )
    assert scrubbed == "probe of http://***@10.0.0.1:9/v1/models failed"


# Key shapes in several cases, the long s and the Kelvin sign (IGNORECASE takes them for `s`
# and `k`), a registered secret, and text around them.
_PIECES = ["sk-", "SK-", "\u017fk-", "s\u212a-", "tg-", "Tk-", "bearer ", "BEARER\t", "abcdef12"]
_PIECES += ["upstream-secret-42"]


@given(st.lists(st.sampled_from([*_PIECES, "x", " ", "-", "_", "\x00", "é"]), max_size=12))
@example(["\u017fk-", "abcdef12"])
@example(["s\u212a-", "abcdef12"])
@example(["BEARER\t", "abcdef12"])
def test_the_one_pass_check_agrees_with_scrubbing(parts: list[str]) -> None:
    """`clean` is what lets a clean record skip value-by-value scrubbing: it must say
    clean exactly when scrubbing would change nothing (key shapes in any case)."""
    redactor = Redactor(["upstream-secret-42"])
    text = "".join(parts)
    assert redactor.clean(text) == (redactor.scrub(text) == text)


def test_secrets_nested_in_structured_fields_are_scrubbed() -> None:
    attempts = [{"n": 1, "model": "sk-live-0123456789abcdef", "domain": "upstream-secret-42"}]
    rec = record("request", fields={"model": "gpt-4o", "attempts": attempts, "n": 2})
    out = through(Redactor(["upstream-secret-42"]), rec)
    assert out["attempts"] == [{"n": 1, "model": "***", "domain": "***"}]
    assert out["model"] == "gpt-4o" and out["n"] == 2


def test_a_clean_record_keeps_its_fields_as_they_are() -> None:
    fields = {"model": "gpt-4o", "attempts": [{"model": "gpt-4o"}], "cost": None}
    rec = record("request", fields=fields)
    out = through(Redactor(["upstream-secret-42"]), rec)
    assert rec.fields is fields  # type: ignore[attr-defined]
    assert out["attempts"] == [{"model": "gpt-4o"}] and out["cost"] is None


def test_each_line_carries_its_own_second() -> None:
    formatter = JsonFormatter()
    stamps = []
    for created in (1_700_000_000.25, 1_700_000_000.75, 1_700_000_001.5, 1_699_999_999.0):
        rec = record("tick")
        rec.created, rec.msecs = created, (created - int(created)) * 1000
        stamps.append(json.loads(formatter.format(rec))["ts"])
    assert stamps == [
        "2023-11-14T22:13:20.250Z",
        "2023-11-14T22:13:20.750Z",
        "2023-11-14T22:13:21.500Z",
        "2023-11-14T22:13:19.000Z",
    ]


@pytest.mark.usefixtures("loggers")
def test_log_fields_writes_the_line_logger_info_writes(tmp_path: Path) -> None:
    path = tmp_path / "gw.log"
    setup_logging(LoggingConfig.model_validate({"output": str(path)}), ["hunter2-secret"], "c")
    logger = logging.getLogger("tokengate.access")
    fields: dict[str, object] = {"key": "bo", "attempts": [{"model": "hunter2-secret"}]}
    logger.info("request", extra={"fields": fields})
    log_fields(logger, "request", fields)
    for handler in logging.getLogger("tokengate").handlers:
        handler.flush()
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    del first["ts"], second["ts"]
    assert first == second
    assert second["attempts"] == [{"model": "***"}] and second["logger"] == "tokengate.access"
