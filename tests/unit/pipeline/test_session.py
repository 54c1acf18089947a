"""Which conversation a request belongs to: explicit ids first, else the leading prompt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.pipeline.request import CHAT
from app.pipeline.session import session_key
from app.pipeline.wire import parse_call
from app.runtime import KeySpec


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


SYS = {"role": "system", "content": "You are a coding agent."}
Q1 = {"role": "user", "content": "fix the bug in app.py"}


@pytest.mark.parametrize(
    ("body", "header", "expected"),
    [
        (chat(Q1, prompt_cache_key="pk", user="u"), "h", b"prompt_cache_key:pk"),
        (chat(Q1, previous_response_id="resp_1", user="u"), None, b"previous_response_id:resp_1"),
        (chat(Q1, safety_identifier="sid", user="u"), None, b"safety_identifier:sid"),
        (chat(Q1, user="u"), "h", b"user:u"),
        (chat(Q1, metadata={"user_id": "cc-session"}), "h", b"user_id:cc-session"),
        (chat(Q1), "sess-9", b"header:sess-9"),
    ],
)
def test_an_explicit_id_names_the_session(
    body: dict[str, Any], header: str | None, expected: bytes
) -> None:
    assert session_key(body, header) == expected


def test_turns_of_one_conversation_share_the_prefix_digest() -> None:
    first = session_key(chat(SYS, Q1), None)
    later = chat(
        SYS,
        {"role": "user", "content": [{"type": "text", "text": "fix the bug in app.py"}]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "now the tests"},
    )
    assert first.startswith(b"prefix:") and session_key(later, None) == first
    other = chat(SYS, {"role": "user", "content": "another task"})
    assert session_key(other, None) != first


def test_anthropic_markers_and_billing_line_do_not_split_a_conversation() -> None:
    system: list[dict[str, Any]] = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    turn1 = {
        "system": system,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
    }
    system2 = [{**system[0], "text": "x-anthropic-billing-header: cc_version=2.1.400;"}, system[1]]
    turn2 = {
        "system": system2,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
    }
    assert session_key(turn1, None) == session_key(turn2, None)


def test_hostile_nesting_is_digested_not_crashed_on() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    assert session_key(chat({"role": "user", "content": deep}), None).startswith(b"prefix:")


def test_a_parsed_request_knows_its_session_and_reads_it_once() -> None:
    """What the dispatcher asks of every request when affinity is on (a slotted record)."""
    raw = json.dumps(chat(SYS, Q1, user="u")).encode()
    call = parse_call(CHAT, raw, KeySpec("k", ("0" * 64,), 1000, 10), "req_s", {}, 0.0)
    assert call.session == b"user:u"
    call.body["user"] = "changed"  # read on first use, then kept
    assert call.session == b"user:u"
