"""Resilience against a misbehaving upstream (`tokengate sim` fault injection)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.waiting import eventually, wait_until

Make = Callable[..., Gateway]
PING = [{"role": "user", "content": "ping"}]
NO_FALLBACK = {"model_route": {"fallback": None}}


def chat(model: str = "claude-sonnet", **extra: object) -> dict[str, object]:
    return {"model": model, "messages": PING, "max_tokens": 4, **extra}


def post(gw: Gateway, body: dict[str, object], timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers(), timeout=timeout
    )


def cancelled(sim: Sim) -> bool:
    """The upstream saw its one chat request's client leave."""
    records = sim.records("/v1/chat/completions")
    return bool(records and records[0]["cancelled"])


def inflight(gw: Gateway) -> int:
    return int(httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]["inflight"])


def fast_retries(**extra: object) -> dict[str, object]:
    return {"retry_policy": {"max_attempts": 3, "backoff_ms": 20, **extra}, **NO_FALLBACK}


def attempts_of(gw: Gateway, status: int | None = None) -> list[list[dict[str, object]]]:
    return [line["attempts"] for line in gw.access() if status is None or line["status"] == status]


def test_two_transient_503s_then_success_on_the_third(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings=fast_retries()), sim.url)
    sim.faults(status=503, count=2)
    r = post(gw, chat())
    assert r.status_code == 200
    assert len(sim.records("/v1/chat/completions")) == 3
    (trace,) = attempts_of(gw, 200)
    assert [a["outcome"] for a in trace] == ["status_503", "status_503", "ok"]
    metrics = gw.metrics()
    assert 'tokengate_upstream_retries_total{domain="domain-a",reason="status_503"} 2.0' in metrics


def test_retry_after_from_the_upstream_is_honoured(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings=fast_retries()), sim.url)
    sim.faults(status=429, count=1, retry_after=1.0)
    started = time.monotonic()
    assert post(gw, chat()).status_code == 200
    assert time.monotonic() - started >= 1.0
    first, second = (r["at"] for r in sim.records("/v1/chat/completions"))
    assert second - first >= 1.0


def test_client_error_is_never_retried_and_is_relayed(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings=fast_retries()), sim.url)
    sim.faults(status=400, count=1)
    r = post(gw, chat())
    assert r.status_code == 400 and r.json()["error"]["message"] == "injected fault (400)"
    assert len(sim.records("/v1/chat/completions")) == 1
    assert r.headers["x-should-retry"] == "false"


def test_persistent_500_uses_max_attempts_then_fallback_then_502(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={
                "retry_policy": {"max_attempts": 3, "backoff_ms": 10},
                "breaker": {"failure_threshold": 100},
            }
        ),
        sim.url,
    )
    sim.faults(status=500, rate=1.0)
    r = post(gw, chat())
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error"
    models = [rec["body"]["model"] for rec in sim.records("/v1/chat/completions")]
    assert models == ["claude-sonnet"] * 3 + ["gpt-4o"] * 3  # primary, then model_route.fallback
    assert r.headers["x-should-retry"] == "false"  # the gateway already spent the retries


def test_fallback_on_another_domain_serves_and_says_so(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    broken, healthy = make_sim("--models", "claude-sonnet"), make_sim("--models", "gpt-4o")
    gw = make_gateway(
        GatewaySpec(
            toml={
                "scale_up": [
                    {"domain": "a", "api_base": broken.url, "api_key_env": "TAOTOKEN_API_KEY"},
                    {"domain": "b", "api_base": healthy.url, "api_key_env": "TAOTOKEN_API_KEY"},
                ]
            },
            settings={"retry_policy": {"max_attempts": 2, "backoff_ms": 10}},
        )
    )
    broken.faults(status=503, rate=1.0)
    answer = gw.openai().chat.completions.with_raw_response.create(
        model="claude-sonnet", messages=PING, max_tokens=3
    )
    assert answer.parse().model == "gpt-4o"
    assert answer.headers["x-tokengate-domain"] == "b"
    (line,) = [x for x in gw.access() if x["status"] == 200]
    assert line["fallback"] is True
    assert [(a["domain"], a["model"]) for a in line["attempts"]] == [
        ("a", "claude-sonnet"),
        ("a", "claude-sonnet"),
        ("b", "gpt-4o"),
    ]


async def test_retry_budget_bounds_attempts_during_an_outage(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={
                **fast_retries(budget_ratio=0.2, budget_min_retries=2, budget_window_sec=60),
                "breaker": {"failure_threshold": 1000, "min_requests": 1000},
            }
        ),
        sim.url,
    )
    sim.faults(status=503, rate=1.0)
    async with httpx.AsyncClient(timeout=30) as c:
        rs = await asyncio.gather(
            *(
                c.post(f"{gw.url}/v1/chat/completions", json=chat(), headers=gw.headers())
                for _ in range(50)
            )
        )
    assert {r.status_code for r in rs} == {502}
    sent = len(sim.records("/v1/chat/completions"))
    assert 50 <= sent <= 50 + 2 + 0.2 * 50, sent  # not 150: the budget held


def test_breaker_opens_shows_in_readiness_and_recovers(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={
                "retry_policy": {"max_attempts": 1},
                **NO_FALLBACK,
                # open long enough for the checks below on a slow machine, then polled shut
                "breaker": {"failure_threshold": 3, "open_sec": 3.0},
            }
        ),
        sim.url,
    )
    sim.faults(status=500, rate=1.0)
    for _ in range(3):
        assert post(gw, chat()).status_code == 502
    ready = httpx.get(f"{gw.url}/health/ready")
    assert ready.status_code == 503
    assert ready.json()["domains"]["domain-a"]["state"] == "circuit_open"
    refused = post(gw, chat())
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_healthy_domain"
    assert len(sim.records("/v1/chat/completions")) == 3  # the open circuit sent nothing
    # gauges are read when scraped: the open circuit shows at once
    assert 'tokengate_upstream_up{domain="domain-a"} 0.0' in gw.metrics()
    sim.faults()  # healed
    # refused while open; once open_sec is over, the half-open probe is served
    wait_until(lambda: post(gw, chat()).status_code == 200, "the half-open probe to pass")
    assert httpx.get(f"{gw.url}/health/ready").status_code == 200


def test_stall_past_the_timeout_is_504(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            toml={"token_scheduler": {"timeout_ms": 300}},
            settings={"retry_policy": {"max_attempts": 2, "backoff_ms": 10}, **NO_FALLBACK},
        ),
        sim.url,
    )
    sim.faults(stall_ms=60_000)  # longer than any run: a 504 came from the gateway's timeout
    started = time.monotonic()
    r = post(gw, chat())
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 60
    # the upstream read the request and may be working on it: not sent again
    assert [a["outcome"] for a in attempts_of(gw, 504)[0]] == ["timeout"]
    assert r.headers["x-should-retry"] == "false"


def test_mid_stream_drop_ends_with_an_error_event_and_is_charged(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(settings=NO_FALLBACK), sim.url)
    sim.faults(drop_after=3)
    got = []
    with pytest.raises(openai.APIError, match=r"broke off|closed the stream early"):
        for chunk in gw.openai().chat.completions.create(
            model="gpt-4o", messages=PING, max_tokens=10, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    assert len(got) == 3
    (line,) = gw.access()
    assert line["status"] == 502 and line["error"] == "stream_interrupted"
    metrics = gw.metrics()
    assert re.search(
        r'tokengate_stream_errors_total\{domain="domain-a",reason="(reset|truncated)"\} 1.0',
        metrics,
    )
    assert 'tokengate_failed_tokens_total{key="alice",kind="completion",model="gpt-4o"}' in metrics


def test_client_disconnect_mid_stream_cancels_the_upstream(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--tokens-per-sec", "20", "--reply-tokens", "100")
    gw = make_gateway(GatewaySpec(), sim.url)
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/chat/completions",
        headers=gw.headers(),
        json=chat(stream=True, max_tokens=100),
        timeout=30,
    ) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    wait_until(lambda: cancelled(sim), "the upstream to see its generation cancelled")
    wait_until(lambda: inflight(gw) == 0, "the gateway to free the slot")


def test_client_disconnect_cancels_a_non_stream_upstream_call(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    # an answer far later than any run of the test: only a cancel ends the upstream's wait
    sim = make_sim("--latency-ms", "60000")
    gw = make_gateway(GatewaySpec(), sim.url)
    with pytest.raises(httpx.ReadTimeout):
        post(gw, chat(), timeout=0.5)
    wait_until(lambda: cancelled(sim), "the upstream to see the call cancelled")


def test_sigterm_drains_streams_in_flight_and_exits_0(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    # streams of 3 s: long enough to be in flight while readiness is asked, on any machine
    sim = make_sim("--tokens-per-sec", "10", "--reply-tokens", "30")
    # a drain delay the readiness poll falls into however slow the machine (then the exit)
    gw = make_gateway(GatewaySpec(settings={"server": {"drain_delay_sec": 3}}), sim.url)

    async def stream() -> list[str]:
        async with (
            httpx.AsyncClient(timeout=30) as c,
            c.stream(
                "POST",
                f"{gw.url}/v1/chat/completions",
                headers=gw.headers(),
                json=chat(stream=True, max_tokens=30),
            ) as r,
        ):
            return [line async for line in r.aiter_lines() if line]

    async def not_ready() -> bool:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{gw.url}/health/ready")).status_code == 503

    async def scenario() -> list[list[str]]:
        tasks = [asyncio.ensure_future(stream()) for _ in range(4)]
        await eventually(lambda: sim.stats()["inflight"] == 4, "the four streams started")
        gw.proc.send_signal(signal.SIGTERM)
        # draining: readiness says 503 while the streams in flight go on
        await eventually(not_ready, "readiness to turn 503 during the drain")
        return list(await asyncio.gather(*tasks))

    streams = asyncio.run(scenario())
    for lines in streams:
        assert lines[-1] == "data: [DONE]"
        assert sum(1 for x in lines if x.startswith("data: {")) >= 30
        assert not any("error" in json.loads(x[6:]) for x in lines if x.startswith("data: {"))
    assert gw.proc.wait(20) == 0
