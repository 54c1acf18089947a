"""What an agent needs relayed byte for byte, over real sockets: Anthropic `thinking`
blocks and their signatures (JSON and stream, both directions: the simulator refuses a
block whose signature no longer matches, as Anthropic does), the Responses API's
`encrypted_content`, and a stream's `message_start.usage` in Claude's shape."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
THINKING_BLOCK = re.compile(
    rb'\{"type":"thinking","thinking":"(?:[^"\\]|\\.)*","signature":"[^"]*"\}'
)
ASK: dict[str, Any] = {
    "model": "claude-sonnet",
    "max_tokens": 2048,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [{"role": "user", "content": "read the notes"}],
}


@pytest.fixture
def gw(sim: Sim, make_gateway: Make) -> Gateway:
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        settings={"model_aliases": {"claude-latest": "claude-sonnet"}},
    )
    return make_gateway(spec, sim.url)


def post(url: str, key: str, raw: bytes, path: str = "/v1/messages") -> httpx.Response:
    headers = {
        "x-api-key": key,
        "authorization": f"Bearer {key}",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    return httpx.post(url + path, content=raw, headers=headers, timeout=30)


def test_thinking_blocks_come_back_byte_for_byte_and_go_back_unchanged(
    gw: Gateway, sim: Sim
) -> None:
    direct = post(sim.url, sim.api_key, orjson.dumps(ASK))
    through = post(gw.url, gw.key, orjson.dumps(ASK))
    assert through.status_code == 200
    (block,) = THINKING_BLOCK.findall(through.content)
    assert THINKING_BLOCK.findall(direct.content) == [block]
    assert b"\\u2028" in block or "\u2028".encode() in block  # the tricky bytes survived
    # the next turn sends the block back exactly as received, spliced in as bytes
    answer = orjson.loads(through.content)
    text = answer["content"][1]
    turn = (
        b'{"model":"claude-sonnet","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens"'
        b':1024},"messages":[{"role":"user","content":"read the notes"},{"role":"assistant",'
        b'"content":['
        + block
        + b","
        + orjson.dumps(text)
        + b']},{"role":"user","content":"go on"}]}'
    )
    sim.clear()
    assert post(gw.url, gw.key, turn).status_code == 200
    (rec,) = sim.records("/v1/messages")
    assert rec["raw_sha256"] == hashlib.sha256(turn).hexdigest()  # not one byte changed
    # an alias makes the gateway rewrite the body: the block is still intact (the sim checks)
    aliased = turn.replace(b'"model":"claude-sonnet"', b'"model":"claude-latest"', 1)
    assert post(gw.url, gw.key, aliased).status_code == 200
    # and a block altered on the way is what the upstream refuses
    tampered = turn.replace(b"Plan:", b"Plan ", 1)
    refused = post(gw.url, gw.key, tampered)
    assert refused.status_code == 400 and "signature" in refused.text


def sse_data(body: bytes, kind: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n") if line.startswith(b"data: ") and kind in line]


def test_streamed_thinking_and_signature_deltas_are_relayed_as_sent(gw: Gateway, sim: Sim) -> None:
    raw = orjson.dumps({**ASK, "stream": True})
    direct = post(sim.url, sim.api_key, raw).content
    through = post(gw.url, gw.key, raw).content
    for kind in (b'"thinking_delta"', b'"signature_delta"'):
        assert sse_data(through, kind) == sse_data(direct, kind) != []
    (start,) = sse_data(through, b'"message_start"')
    usage = orjson.loads(start[6:])["message"]["usage"]
    assert set(usage) >= {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }


def test_encrypted_reasoning_reaches_the_upstream_unchanged(gw: Gateway, sim: Sim) -> None:
    body = (
        b'{"model":"gpt-4o","store":false,"include":["reasoning.encrypted_content"],"input":['
        b'{"type":"message","role":"user","content":"hi"},'
        b'{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAAB\\u002b/x=="},'
        b'{"type":"message","role":"user","content":"go on"}]}'
    )
    r = post(gw.url, gw.key, body, "/v1/responses")
    assert r.status_code == 200, r.text
    (rec,) = sim.records("/v1/responses")
    assert rec["raw_sha256"] == hashlib.sha256(body).hexdigest()
    assert rec["body"]["input"][1]["encrypted_content"] == "gAAAAB+/x=="
