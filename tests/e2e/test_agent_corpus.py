"""The conformance corpus: what the pinned Codex CLI and Claude Code really sent (and what
their vendor's API answered), replayed through `tokengate serve` in front of `tokengate
sim`, in each upstream shape the gateway can put behind a client:

    chat           a chat-completions-only upstream (`responses = "chat"`)
    responses      an upstream with the Responses API, over HTTP + SSE
    responses-ws   an upstream with the Responses WebSocket mode (`responses_websocket`)
    anthropic      an upstream with the Messages API (`api_style = "anthropic"`)

Each recorded request goes through the gateway as the client sent it (its headers, its
body, its WebSocket frames in order on one connection), and the answer must be what the
client got from its vendor: the same stream events, output items and stop reason (on a
chat upstream, which has no reasoning items, the same items but those). Fixtures:
`tests/fixtures/agents/*.json`, written by `make agents-refresh`
(`tests/support/agents_record.py`) from the client versions the Makefile pins.
Claude Code speaks only the Messages API, which tokengate never translates: its corpus
runs on the `anthropic` shape only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client

from tests.support.procs import ROOT, Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
MODELS = "local-model,claude-sonnet"
SHAPES: dict[str, dict[str, Any]] = {
    "chat": {"responses": "chat"},
    "responses": {},
    "responses-ws": {"responses_websocket": True},
    "anthropic": {"api_style": "anthropic"},
}
CLIENT_SHAPES = {"codex": ("chat", "responses", "responses-ws"), "claude-code": ("anthropic",)}


def corpus(client: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{client}.json").read_text()))


def cases() -> Iterator[Any]:
    for client, shapes in CLIENT_SHAPES.items():
        for shape in shapes:
            yield pytest.param(client, shape, id=f"{client}-{shape}")


def test_the_corpus_is_from_the_pinned_clients() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for client, var in (("codex", "CODEX_VERSION"), ("claude-code", "CLAUDE_CODE_VERSION")):
        pinned = next(
            ln.split(":=")[1].strip() for ln in makefile.splitlines() if ln.startswith(var)
        )
        assert corpus(client)["version"] == pinned, f"run `make agents-refresh` ({client})"
    text = "".join(p.read_text() for p in FIXTURES.glob("*.json"))
    for secret in ("sk-upstream", "tg-test", "/tmp/agents-"):
        assert secret not in text
    ids = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", text)
    assert ids and all(i.startswith("00000000-0000-4000-8000-") for i in ids)  # placeholders
    for client in CLIENT_SHAPES:
        for exchange in corpus(client)["exchanges"]:
            assert not {"authorization", "x-api-key", "cookie"} & set(exchange["headers"])


@pytest.mark.parametrize(("client", "shape"), list(cases()))
def test_recorded_traffic_gets_what_the_client_expects(
    make_sim: Callable[..., Sim], make_gateway: Make, client: str, shape: str
) -> None:
    named = ("--tool-calls", "named") if client == "claude-code" else ()
    sim = make_sim("--models", MODELS, "--responses-websocket", *named)
    up = {"domain": "up", "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY"}
    gw = make_gateway(GatewaySpec(toml={"scale_up": [{**up, **SHAPES[shape]}]}))
    exchanges = corpus(client)["exchanges"]
    http = [e for e in exchanges if e["transport"] == "http"]
    frames = [e for e in exchanges if e["transport"] == "websocket"]
    if shape != "responses-ws":  # a socket-mode upstream answers HTTP as `responses` does
        for exchange in http:
            check(exchange, replay_http(gw, exchange), shape)
    for exchange, events in zip(frames, replay_socket(gw, frames), strict=True):
        check(exchange, events, shape)
    if client == "claude-code":
        sent = sim.records("/v1/messages")
        assert [r["headers"]["anthropic-beta"] for r in sent] == [
            e["headers"]["anthropic-beta"] for e in http if e["path"] == "/v1/messages"
        ]


def check(exchange: dict[str, Any], events: list[dict[str, Any]], shape: str) -> None:
    want = exchange["expect"]
    kinds = [e.get("type") for e in events]
    if "response.created" in want["events"]:  # the Responses API
        assert kinds[0] == "response.created" and kinds[-1] == want["events"][-1], kinds
        final = events[-1]["response"]
        output = [item["type"] for item in final.get("output") or []]
        if shape == "chat":  # no reasoning items on chat
            assert output == [t for t in want["output"] if t != "reasoning"], kinds
        elif exchange["body"].get("generate") is False:
            assert output == [] == want["output"]
        else:
            assert (kinds, output) == (want["events"], want["output"])
    else:  # the Messages API
        assert kinds == want["events"]
        stop = [e["delta"]["stop_reason"] for e in events if e.get("type") == "message_delta"]
        assert stop[-1:] == [want["stop_reason"]]


def replay_http(gw: Gateway, exchange: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {**exchange["headers"], "authorization": f"Bearer {gw.key}", "x-api-key": gw.key}
    r = httpx.post(gw.url + exchange["path"], json=exchange["body"], headers=headers, timeout=60)
    assert r.status_code == exchange["expect"]["status"], r.text
    lines = r.text.split("\n")  # not splitlines(): a JSON string may hold U+2028
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def replay_socket(gw: Gateway, frames: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    if not frames:
        return []
    url = gw.url.replace("http", "ws") + "/v1/responses"
    headers = {**frames[0]["headers"], "authorization": f"Bearer {gw.key}"}
    answers = []
    with ws_client.connect(url, additional_headers=headers) as ws:
        last = None
        for exchange in frames:
            frame = dict(exchange["body"])
            if "previous_response_id" in frame and last is not None:
                frame["previous_response_id"] = last  # this connection's own ids
            ws.send(json.dumps(frame))
            events: list[dict[str, Any]] = []
            while not events or events[-1].get("type") not in (*TERMINAL, "error"):
                events.append(json.loads(ws.recv(timeout=60)))
            assert events[-1]["type"] != "error", events[-1]
            last = events[-1]["response"]["id"]
            answers.append(events)
    return answers


def test_make_agents_refresh_is_wired() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "agents-refresh:" in makefile and "tests.support.agents_record" in makefile
    assert Path(ROOT / "tests" / "support" / "agents_record.py").exists()
