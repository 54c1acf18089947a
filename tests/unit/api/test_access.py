"""Every request on the record: a refused request writes one access-log line and one
`tokengate_requests_total` sample, with the caller's alias (never a presented secret)
and `domain="none"`; a request the pipeline handled is not written twice."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.metrics import Metrics, new_registry
from app.runtime import compile_runtime
from tests.support.inproc import CHAT_OK, Lifespan, local_settings, mock_transport
from tests.support.waiting import eventually

GOOD = "tg-unit-good-key-0123456789"
LATE = "tg-unit-late-key-0123456789"
WRONG = "tg-unit-wrong-key-9876543210"
Build = Callable[..., Awaitable[tuple[httpx.AsyncClient, Metrics]]]


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def chat_ok(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m-1"}]})
    return httpx.Response(200, json=CHAT_OK)


@pytest.fixture
async def build(tmp_path: Path) -> AsyncIterator[Build]:
    async with AsyncExitStack() as stack:

        async def make(
            settings: dict[str, Any] | None = None,
            handler: Callable[[httpx.Request], httpx.Response] = chat_ok,
        ) -> tuple[httpx.AsyncClient, Metrics]:
            keys = [
                {"alias": "alice", "key_sha256": sha(GOOD)},
                {"alias": "late", "key_sha256": sha(LATE), "expires_at": "2020-01-01T00:00:00Z"},
            ]
            data = {"keys": keys, "scale_up": {"models": ["m-1"]}, **(settings or {})}
            runtime = compile_runtime(
                local_settings(tmp_path, data), {"TAOTOKEN_API_KEY": "sk-upstream-unit"}
            )
            metrics = Metrics(new_registry())
            app = create_app(runtime, metrics=metrics, transport_factory=mock_transport(handler))
            await stack.enter_async_context(Lifespan(app))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://gateway"
            )
            return await stack.enter_async_context(client), metrics

        yield make


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Callable[[], list[dict[str, Any]]]:
    caplog.set_level(logging.INFO, logger="tokengate.access")

    def read() -> list[dict[str, Any]]:
        return [r.fields for r in caplog.records if r.name == "tokengate.access"]  # type: ignore[attr-defined]

    return read


def requests_total(metrics: Metrics, **labels: str) -> float:
    value = metrics.registry.get_sample_value("tokengate_requests_total", labels)
    return value or 0.0


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


CHAT = {"model": "m-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_each_401_is_on_the_record_without_the_presented_key(
    build: Build, lines: Callable[[], list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    client, metrics = await build()
    for headers in ({}, auth(WRONG), auth(LATE)):
        r = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401
    r = await client.get("/v1/models", headers=auth(WRONG))  # a FastAPI route
    assert r.status_code == 401
    got = [(line["key"], line["error"], line["endpoint"], line["status"]) for line in lines()]
    assert got == [
        ("anonymous", "missing_api_key", "chat", 401),
        ("anonymous", "invalid_api_key", "chat", 401),
        ("late", "expired_api_key", "chat", 401),  # the right key, too late: whose it was
        ("anonymous", "invalid_api_key", "/v1/models", 401),
    ]
    assert all(line["domain"] == "none" for line in lines())
    assert requests_total(metrics, domain="none", model="none", status="401") == 4
    text = caplog.text + json.dumps(lines())
    assert WRONG not in text and LATE not in text


@pytest.mark.parametrize(
    ("send", "status", "error"),
    [
        (lambda c: c.get("/v1/chat/completions", headers=auth(GOOD)), 405, "method_not_allowed"),
        (
            lambda c: c.post("/v1/chat/completions", content=b"x" * 300, headers=auth(GOOD)),
            413,
            "request_too_large",
        ),
        (
            lambda c: c.post("/v1/chat/completions", content=b"{nope", headers=auth(GOOD)),
            400,
            "invalid_json",
        ),
        (lambda c: c.get("/v1/nowhere", headers=auth(GOOD)), 404, "not_found"),
        (
            lambda c: c.get("/v1/models", headers={**auth(GOOD), "x-big": "y" * 400}),
            431,
            "headers_too_large",
        ),
    ],
)
async def test_a_refusal_before_the_pipeline_writes_one_line_and_one_sample(
    build: Build,
    lines: Callable[[], list[dict[str, Any]]],
    send: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]],
    status: int,
    error: str,
) -> None:
    client, metrics = await build({"server": {"max_body_bytes": 200, "max_header_bytes": 400}})
    r = await send(client)
    assert r.status_code == status
    [line] = lines()
    assert (line["status"], line["error"], line["domain"]) == (status, error, "none")
    assert line["request_id"] == r.headers["x-request-id"]
    # authenticated before the refusal: the alias; refused before authentication: anonymous
    assert line["key"] in ("alice", "anonymous")
    assert requests_total(metrics, domain="none", model="none", status=str(status)) == 1


async def test_the_pipeline_line_is_the_only_one_and_probes_write_none(
    build: Build, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    client, metrics = await build()
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=auth(GOOD))).is_success
    for path in ("/health", "/health/ready", "/metrics"):
        await client.get(path)
    assert (await client.get("/v1/models", headers=auth(GOOD))).is_success
    got = [(line["endpoint"], line["key"], line["status"]) for line in lines()]
    assert got == [("chat", "alice", 200), ("/v1/models", "alice", 200)]
    pipeline_line, recorded_line = lines()
    assert set(recorded_line) == set(pipeline_line)  # one schema for every access line
    assert requests_total(metrics, domain="default", model="m-1", status="200") == 1


async def test_a_full_queue_is_counted_under_its_domain(
    build: Build, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    release = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return httpx.Response(200, json=CHAT_OK)

    sched = {"token_scheduler": {"queue_capacity": 1, "max_inflight": 1}}
    client, metrics = await build(sched, handler=slow)
    # the counter exists from the start, so rate() and increase() see the first refusal
    assert (
        metrics.registry.get_sample_value("tokengate_queue_full_total", {"domain": "default"}) == 0
    )
    busy = [
        asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=auth(GOOD)))
        for _ in range(2)
    ]

    async def line_full() -> bool:  # one at the upstream, one queued: the queue is full
        domain = (await client.get("/health/ready")).json()["domains"]["default"]
        return bool(domain["inflight"] == 1 and domain["queue_depth"] == 1)

    await eventually(line_full, "one request in flight and one queued")
    r = await client.post("/v1/chat/completions", json=CHAT, headers=auth(GOOD))
    release.set()
    await asyncio.gather(*busy)
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    refused = [line for line in lines() if line["status"] == 503]
    assert [(line["domain"], line["error"]) for line in refused] == [("default", "queue_full")]
    assert requests_total(metrics, domain="default", model="m-1", status="503") == 1
    full = metrics.registry.get_sample_value("tokengate_queue_full_total", {"domain": "default"})
    assert full == 1


async def test_a_refusal_by_the_pipeline_is_written_once_by_it(
    build: Build, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    client, metrics = await build()
    unknown = {**CHAT, "model": "no-such-model"}
    r = await client.post("/v1/chat/completions", json=unknown, headers=auth(GOOD))
    assert r.status_code == 404
    [line] = lines()  # the pipeline's own line, not a second one from the request context
    assert (line["key"], line["error"], line["domain"]) == ("alice", "model_not_found", "none")
    assert requests_total(metrics, domain="none", model="other", status="404") == 1
