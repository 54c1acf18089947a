"""The proxy path end to end: the official openai SDK -> tokengate serve -> tokengate sim."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.procs import UPSTREAM_KEY, Gateway, Sim

PING = [{"role": "user", "content": "ping"}]


def test_chat_non_stream_answers_with_usage_and_serving_domain(gateway: Gateway, sim: Sim) -> None:
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="claude-sonnet", messages=PING, max_tokens=8
    )
    answer = raw.parse()
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert raw.headers["x-tokengate-domain"] == "domain-a"
    assert raw.headers["x-request-id"].startswith("req_")
    assert int(raw.headers["x-ratelimit-limit-requests"]) == 600


def test_stream_reassembles_to_the_same_text_as_non_stream(gateway: Gateway) -> None:
    client = gateway.openai()
    whole = client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=12)
    parts = []
    chunks = client.chat.completions.create(
        model="gpt-4o", messages=PING, max_tokens=12, stream=True
    )
    for chunk in chunks:
        assert chunk.usage is None  # the client did not ask for usage: it must not see it
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == whole.choices[0].message.content


def test_stream_passes_usage_through_when_the_client_asks(gateway: Gateway) -> None:
    chunks = list(
        gateway.openai().chat.completions.create(
            model="gpt-4o",
            messages=PING,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 5


def test_completions_embeddings_and_models(gateway: Gateway) -> None:
    client = gateway.openai()
    text = client.completions.create(model="gpt-4o", prompt="say hi", max_tokens=3)
    assert text.choices[0].text.strip() and text.usage.completion_tokens == 3
    emb = client.embeddings.create(model="text-embedding-3-small", input=["a", "b c"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 16
    ids = {m.id for m in client.models.list()}
    assert {"claude-sonnet", "gpt-4o", "text-embedding-3-small"} <= ids


def test_upstream_sees_only_its_own_key_never_the_clients(gateway: Gateway, sim: Sim) -> None:
    gateway.openai().chat.completions.create(
        model="claude-sonnet",
        messages=PING,
        max_tokens=2,
        extra_headers={"x-api-key": "client-secret-header", "cookie": "session=abc"},
    )
    (rec,) = sim.records("/v1/chat/completions")
    assert rec["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    sent = str(rec["headers"])
    assert gateway.key not in sent and "client-secret-header" not in sent
    assert "cookie" not in rec["headers"]


@pytest.mark.parametrize("key", [None, "tg-wrong-key"])
def test_wrong_or_missing_key_gets_401_body(gateway: Gateway, sim: Sim, key: str | None) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        headers=headers,
        json={"model": "gpt-4o", "messages": PING},
    )
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.headers["x-request-id"]
    assert sim.records("/v1/chat/completions") == []


def test_sdk_raises_authentication_error(gateway: Gateway) -> None:
    client = gateway.keep(
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="tg-nope", max_retries=0)
    )
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "gpt-4o", "messages": [', None),
        (b'{"model": 42, "messages": []}', "model"),
        (b'{"model": "gpt-4o", "messages": "hi"}', "messages"),
        (b'{"model": "gpt-4o", "messages": [{"role": "user"}], "max_tokens": -1}', "max_tokens"),
        (b'{"model": "gpt-4o", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'["not", "an", "object"]', None),
        (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None),
    ],
)
def test_malformed_bodies_get_400_and_never_reach_upstream(
    gateway: Gateway, sim: Sim, body: bytes, param: str | None
) -> None:
    r = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={**gateway.headers(), "content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert sim.records("/v1/chat/completions") == []


def test_64_mib_body_is_refused_with_413_before_the_upstream(gateway: Gateway, sim: Sim) -> None:
    size = 64 * 1024 * 1024
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {gateway.key}\r\n"
        f"content-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(head + b"{" + b" " * 65536)
        answer = ""
        while "request_too_large" not in answer and (data := s.recv(65536)):
            answer += data.decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert "request_too_large" in answer
    assert sim.records("/v1/chat/completions") == []


def test_64_mib_chunked_body_is_cut_off_at_the_limit(gateway: Gateway, sim: Sim) -> None:
    def body() -> Iterator[bytes]:
        chunk = b" " * (1024 * 1024)
        yield b'{"model": "gpt-4o", "messages": ['
        for _ in range(64):
            yield chunk

    with httpx.Client(timeout=30) as client:
        try:
            r = client.post(
                f"{gateway.url}/v1/chat/completions", content=body(), headers=gateway.headers()
            )
        except httpx.HTTPError:
            pytest.fail("the gateway should answer 413, not drop the connection")
    assert r.status_code == 413
    assert sim.records("/v1/chat/completions") == []


def test_unknown_model_gets_404_saying_where_to_look(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        gateway.openai().chat.completions.create(model="no-such-model", messages=PING)
    assert "GET /v1/models" in str(err.value)


def test_default_model_fills_a_request_without_one(gateway: Gateway, sim: Sim) -> None:
    r = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        headers=gateway.headers(),
        json={"messages": PING, "max_tokens": 2},
    )
    assert r.status_code == 200
    assert sim.records("/v1/chat/completions")[0]["body"]["model"] == "claude-sonnet"


def test_unknown_route_is_an_openai_404(gateway: Gateway) -> None:
    r = httpx.get(f"{gateway.url}/v1/nothing-here", headers=gateway.headers())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
