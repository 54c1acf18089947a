"""Every `TOKENGATE_*` variable read is declared once and listed in the reference; any
other is named, with the nearest name that is read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from app.config.reference import render
from app.config.variables import OUTSIDE, is_read, known, settings_variables, unread, warnings

ROOT = Path(__file__).resolve().parents[3]


def test_the_reference_lists_exactly_the_variables_configuration_reads() -> None:
    listed = set(re.findall(r"`(TOKENGATE_[A-Z0-9_]+)`", render()))
    assert listed == known()
    assert "TOKENGATE_SCALE_UP__API_STYLE" in listed  # the single-table domain's fields
    assert {"TOKENGATE_REDIS_URL", "TOKENGATE_CONFIG", "TOKENGATE_API_KEY"} <= listed


def test_every_variable_the_code_reads_is_declared() -> None:
    """A `TOKENGATE_*` name spelled in the code is a setting or in OUTSIDE, so none that
    tokengate reads is ever reported as unread."""
    spelled = subprocess.run(
        [
            "grep",
            "-rhoE",
            "--exclude=variables.py",
            r"TOKENGATE_[A-Z][A-Z0-9_]*[A-Z0-9]",
            "app",
            "tests/support",
            "Makefile",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    whole = {n for n in spelled if not n.endswith("__")}
    undeclared = sorted(n for n in whole if not is_read(n))
    assert undeclared == []


def test_a_misspelt_variable_is_named_with_the_nearest_read_name() -> None:
    env = {
        "TOKENGATE_API_BASE": "http://x",
        "TOKENGATE_LOGGING_OUTPUT": "stderr",
        "TOKENGATE_SERVER__DRAIN_TIMEOUT": "3",  # pydantic refuses it too (exit 2)
        "TOKENGATE_RATELIMIT__TOKENS_PER_MINUTE": "5",  # no such section: ignored by pydantic
        "TOKENGATE_ZZZ": "1",
        "TOKENGATE_LOGGING__OUTPUT": "stderr",  # read
        "TOKENGATE_REDIS_URL": "redis://r",  # read (shorthand)
        "TOKENGATE_MODEL_ALIASES": "{}",
        "TOKENGATE_REDIS": "{}",  # a whole section as JSON
        "TOKENGATE_BILLING__PRICES__GPT_4O": "{}",  # inside a map: read by pydantic-settings
        "TAOTOKEN_API_KEY": "sk",  # not ours
    }
    assert dict(unread(env)) == {
        "TOKENGATE_API_BASE": "TOKENGATE_API_ENDPOINT",  # other tools' name for it
        "TOKENGATE_LOGGING_OUTPUT": "TOKENGATE_LOGGING__OUTPUT",
        "TOKENGATE_SERVER__DRAIN_TIMEOUT": "TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC",
        "TOKENGATE_RATELIMIT__TOKENS_PER_MINUTE": "TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE",
        "TOKENGATE_ZZZ": None,
    }
    (line,) = warnings({"TOKENGATE_LOGGING_OUTPUT": "x"})
    (secret,) = warnings({"TOKENGATE_ADMINKEY": "s3cret-admin"})  # a misspelt secret
    assert "s3cret" not in secret and "TOKENGATE_ADMIN_KEY" in secret  # named, never shown
    assert line == (
        "TOKENGATE_LOGGING_OUTPUT is set, but tokengate reads no such variable (ignored); "
        "did you mean TOKENGATE_LOGGING__OUTPUT?"
    )


def test_outside_names_are_not_settings() -> None:
    assert not set(OUTSIDE) & set(settings_variables())
