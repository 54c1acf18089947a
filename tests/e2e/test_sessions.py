"""Spend per agent session over real sockets: Claude Code's and Codex's session ids (and
`prompt_cache_key`) in the ledger, `/admin/usage?group_by=session`, `tokengate usage --by
session`, the status page's costliest sessions, and a per-session cap that stops one
runaway session with a 429 the SDK surfaces, while the key's other sessions go on."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim, run_cli

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
CODEX = "01a24543-cc8c-7322-b18b-d698064583b7"
ASK: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gw(sim: Sim, make_gateway: Make) -> Gateway:
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        settings={"admin_key": ADMIN},
        keys={"alice": {"session_budget": {"period": "day", "max_tokens": 100}}},
    )
    return make_gateway(spec, sim.url)


def claude(gw: Gateway, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gw.url,
        api_key=gw.key,
        max_retries=0,
        default_headers={"x-claude-code-session-id": session},
    )


def admin(gw: Gateway, path: str) -> Any:
    r = httpx.get(f"{gw.url}{path}", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_sessions_are_reported_and_a_runaway_one_is_stopped(gw: Gateway) -> None:
    with claude(gw, "loop-1") as loop:
        loop.messages.create(model="claude-sonnet", max_tokens=64, messages=ASK)
    with gw.openai() as client:  # Codex: its session header, and its prompt_cache_key
        client.responses.create(
            model="gpt-4o", input="hi", extra_headers={"session-id": CODEX, "thread-id": CODEX}
        )
        client.chat.completions.create(
            model="gpt-4o", messages=ASK, extra_body={"prompt_cache_key": "thread-b"}
        )
        client.chat.completions.create(model="gpt-4o", messages=ASK)  # no session
    # the runaway session keeps going until its 100 tokens are spent, then is refused
    refused = None
    with claude(gw, "loop-1") as loop:
        for _ in range(20):
            try:
                loop.messages.create(model="claude-sonnet", max_tokens=64, messages=ASK)
            except anthropic.APIStatusError as exc:
                refused = exc
                break
    assert refused is not None and refused.status_code == 429
    message = refused.body["error"]["message"]  # type: ignore[index]
    assert "loop-1" in message and "of its 100 per day" in message and "resets at" in message
    with claude(gw, "calm-2") as calm:  # the key's other sessions go on
        assert calm.messages.create(model="claude-sonnet", max_tokens=8, messages=ASK).content

    body = admin(gw, "/admin/usage?group_by=session")
    by_session = {row["session"]: row for row in body["data"]}
    assert set(by_session) == {"loop-1", CODEX, "thread-b", "-", "calm-2"}
    assert by_session["loop-1"]["prompt_tokens"] + by_session["loop-1"]["completion_tokens"] >= 100
    # refused before admission: nothing consumed, so no ledger row; the access log has it
    assert [a["status"] for a in gw.access() if a.get("error") == "session_budget_exceeded"] == [
        429
    ]

    done = run_cli(
        "usage",
        "--target",
        gw.url,
        "--by",
        "session",
        "--format",
        "json",
        env={"TOKENGATE_ADMIN_KEY": ADMIN, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert {r["session"] for r in json.loads(done.stdout)["data"]} == set(by_session)

    shown = admin(gw, "/admin/ui/snapshot")["sessions"]
    assert shown[0]["session"] == "loop-1" and shown[0]["key"] == "alice"
    assert {s["session"] for s in shown} == {"loop-1", CODEX, "thread-b", "calm-2"}


def test_a_hostile_session_id_is_bounded_before_it_reaches_ledger_or_page(gw: Gateway) -> None:
    hostile = "<img src=x onerror=alert(1)>" + "A" * 500
    with claude(gw, hostile) as client:
        client.messages.create(model="claude-sonnet", max_tokens=8, messages=ASK)
    (row,) = admin(gw, "/admin/usage?group_by=session")["data"]
    assert row["session"].startswith("h:") and len(row["session"]) == 18
    shown = admin(gw, "/admin/ui/snapshot")["sessions"]
    assert [s["session"] for s in shown] == [row["session"]]
    assert "onerror" not in json.dumps(admin(gw, "/admin/ui/snapshot"))
