"""Faults, each ending in the outcome docs/requests.md "Failures" documents, with the books right.

Every scenario runs real traffic through a real gateway while the simulated upstream
(or Redis, or the gateway itself) misbehaves, and then checks two things: every client
got a documented answer (never a bare 500, never a hang), and the usage ledger
(`GET /admin/usage`) bills exactly the usage the upstream reported in the answers the
clients received, with interrupted streams charged to the `failed_*` counters.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
import pytest

from app.limits.estimate import TextCounter, chat_prompt_tokens
from tests.e2e.chaos._support import (
    ADMIN,
    PING,
    Make,
    Tally,
    assert_ledger_matches,
    burst,
    chat,
    ledger_totals,
    metric_sum,
    quiescent,
    send,
    sse_events,
    stream_chat,
)
from tests.support.procs import Gateway, GatewaySpec, Redis, Sim, start_sim
from tests.support.waiting import PATIENCE, eventually, wait_until

NO_FALLBACK = {"model_route": {"fallback": None}}
CALM_BREAKER = {"breaker": {"failure_threshold": 10_000, "min_requests": 10_000}}


def spec(**settings: Any) -> GatewaySpec:
    toml = settings.pop("toml", {})
    return GatewaySpec(
        toml=toml,
        settings={
            "admin_key": ADMIN,
            **NO_FALLBACK,
            "retry_policy": {"max_attempts": 3, "backoff_ms": 10, "budget_min_retries": 1000},
            **settings,
        },
        keys={"alice": {"requests_per_minute": 1_000_000, "tokens_per_minute": 10**10}},
    )


def mixed(n: int) -> list[dict[str, Any]]:
    return [stream_chat(max_tokens=5) if i % 3 == 0 else chat(max_tokens=5) for i in range(n)]


def error_codes(tally: Tally) -> dict[str, int]:
    """`error.code` of every JSON error body the clients received."""
    out: dict[str, int] = defaultdict(int)
    for text in tally.bodies:
        if text.startswith("{"):
            body = json.loads(text)
            if "error" in body:
                out[body["error"]["code"]] += 1
    return dict(out)


def by_request(sim: Sim) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in sim.records("/v1/chat/completions"):
        out[rec["headers"]["x-request-id"]].append(rec)
    return out


# -- upstream status faults ---------------------------------------------------------------------
async def test_5xx_burst_is_retried_then_502_and_billed_only_for_answers(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(spec(**CALM_BREAKER), sim.url)
    sim.faults(status=503, rate=0.6)
    tally = await burst(gw, mixed(90), concurrency=30, keep_body=True)
    sim.faults()
    assert set(tally.statuses) <= {200, 502}, tally.statuses
    assert tally.statuses.get(200, 0) > 0 and tally.statuses.get(502, 0) > 0, tally.statuses
    assert error_codes(tally) == {"upstream_error": tally.statuses[502]}
    attempts = [len(recs) for recs in by_request(sim).values()]
    assert len(attempts) == 90 and max(attempts) == 3  # retried, never past max_attempts
    quiescent(gw, sim)
    totals = assert_ledger_matches(gw, tally)
    assert (totals["requests"], totals["errors"]) == (90, tally.statuses[502])
    assert (totals["failed_prompt_tokens"], totals["failed_completion_tokens"]) == (0, 0)
    print(f"5xx burst: {tally.statuses}, attempts/request max {max(attempts)}, ledger {totals}")
    # the burst is over: the same gateway serves again
    after = await burst(gw, mixed(6))
    assert after.statuses == {200: 6}


async def test_429_storm_is_flow_control_then_503_with_retry_after(
    sim: Sim, make_gateway: Make
) -> None:
    # Default breaker: a 429 storm must never open it (429 is flow control, not a fault).
    gw = make_gateway(spec(toml={"token_scheduler": {"max_queue_wait_ms": 1500}}), sim.url)
    sim.faults(status=429, rate=1.0, retry_after=0.3)
    tally = await burst(gw, mixed(12), concurrency=12, keep_body=True)
    # Each request waited at the head of the queue, cool-down after cool-down, until its
    # max_queue_wait_ms ran out: 503 with a Retry-After, never a 502 or an open circuit.
    assert tally.statuses == {503: 12}, tally.statuses
    assert tally.missing_retry_after == []
    assert set(error_codes(tally)) <= {"queue_timeout", "upstream_rate_limited"}, error_codes(tally)
    ready = httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]
    # flow control, not a fault: the circuit stayed closed, and the domain was throttled
    # (counted; its "throttled" state lasts only as long as the last cool-down, which a
    # slow machine may have outlived by the time readiness is read)
    assert ready["breaker"] == "closed" and ready["state"] in ("throttled", "healthy")
    refusals = len(sim.records("/v1/chat/completions"))  # every attempt met a 429
    assert metric_sum(gw.metrics(), "tokengate_upstream_throttled_total") == refusals > 0
    records = sim.records("/v1/chat/completions")
    starts = sorted(r["at"] for r in records)
    # The domain-wide cool-down: after each 429 nothing went for the advertised 0.3 s
    # (attempts come in waves, one wave per cool-down), so 12 clients sent few requests.
    waves = [b - a for a, b in itertools.pairwise(starts) if b - a > 0.25]
    assert len(waves) >= 2 and len(records) <= 12 * 3, (len(records), waves)
    quiescent(gw, sim)
    totals = assert_ledger_matches(gw, tally)
    assert (totals["requests"], totals["errors"]) == (12, 12)
    # A Retry-After longer than the queue wait: 503 at once, one upstream attempt. On a
    # gateway of its own: the storm's gateway learned a pace of about 1 request/s from it
    # and is still paying for the attempts it sent, so a newcomer there may rightly wait.
    fresh = make_gateway(spec(toml={"token_scheduler": {"max_queue_wait_ms": 1500}}), sim.url)
    sim.clear()
    sim.faults(status=429, rate=1.0, retry_after=45)
    r = httpx.post(f"{fresh.url}/v1/chat/completions", json=chat(), headers=fresh.headers())
    assert r.status_code == 503 and 1 <= int(r.headers["retry-after"]) <= 60
    assert r.json()["error"]["code"] == "upstream_rate_limited"
    assert len(sim.records("/v1/chat/completions")) == 1
    metrics = fresh.metrics()
    assert 'tokengate_upstream_throttled_total{domain="domain-a"}' in metrics
    assert 'tokengate_upstream_retries_total{domain="domain-a",reason="throttled"}' not in metrics
    quiescent(fresh, sim)
    totals = assert_ledger_matches(fresh, Tally())
    assert (totals["requests"], totals["errors"]) == (1, 1)
    print(f"429 storm: {tally.statuses}, {len(records)} upstream attempts, waves {waves}")


# -- time and connection faults -----------------------------------------------------------------
async def test_stall_past_the_timeout_is_504_and_the_upstream_is_let_go(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(spec(toml={"token_scheduler": {"timeout_ms": 250}}, **CALM_BREAKER), sim.url)
    # A stall far longer than any run of this test: answers that came back were timed out
    # by the gateway, not waited out, however slow the machine (the sim stops waiting as
    # soon as its client leaves, so the long stall costs nothing).
    sim.faults(stall_ms=60_000)
    started = time.monotonic()
    tally = await burst(gw, mixed(10), concurrency=10, keep_body=True)
    elapsed = time.monotonic() - started
    sim.faults()
    assert tally.statuses == {504: 10}, tally.statuses
    assert error_codes(tally) == {"upstream_timeout": 10}
    assert elapsed < 60, "the stall was waited out instead of timed out"
    # every timed-out attempt was abandoned: the upstream saw its client leave
    wait_until(
        lambda: all(r["cancelled"] for r in sim.records("/v1/chat/completions")),
        "the upstream to see every stalled attempt cancelled",
    )
    # a stalled attempt may have been acted on: never sent again (10 requests, 10 sends)
    assert len(sim.records("/v1/chat/completions")) == 10
    assert metric_sum(gw.metrics(), "tokengate_upstream_resends_total") == 0
    ok = await burst(gw, mixed(6))
    assert ok.statuses == {200: 6}
    quiescent(gw, sim)
    totals = assert_ledger_matches(gw, ok)
    assert (totals["requests"], totals["errors"]) == (16, 10)
    print(f"stall: {tally.statuses} in {elapsed:.2f}s; ledger {totals}")


async def test_connection_resets_are_never_re_sent(sim: Sim, make_gateway: Make) -> None:
    """A reset after the upstream read the request (it may have acted on it, and billed
    it) is answered 502 at once, `x-should-retry: false`, and never sent again: every
    request reaches the upstream exactly once, whatever happened to its answer."""
    gw = make_gateway(spec(**CALM_BREAKER), sim.url)
    sim.faults(reset=True, rate=0.5)
    tally = await burst(gw, mixed(60), concurrency=20, keep_body=True)
    sim.faults()
    assert set(tally.statuses) <= {200, 502, "stream_error"}, tally.statuses
    assert tally.statuses.get(200, 0) > 0 and tally.statuses.get(502, 0) > 0, tally.statuses
    assert set(error_codes(tally)) <= {"upstream_error"}
    for text in tally.bodies:
        if text.startswith("data:") and not text.rstrip().endswith("[DONE]"):
            assert sse_events(text)[-1]["error"]["code"] == "stream_interrupted", text
        elif '"upstream_error"' in text:
            assert "not sent again" in text, text
    assert len(sim.records("/v1/chat/completions")) == 60  # each request sent once
    assert metric_sum(gw.metrics(), "tokengate_upstream_resends_total") == 0
    quiescent(gw, sim)
    totals = assert_ledger_matches(gw, tally)
    failed = tally.statuses.get(502, 0) + tally.statuses.get("stream_error", 0)
    assert (totals["requests"], totals["errors"]) == (60, failed)
    # what the upstream read and never answered is on the books at its prompt estimate
    assert totals["failed_prompt_tokens"] >= failed > 0
    assert sim.stats()["inflight"] == 0
    assert (await burst(gw, mixed(3))).statuses == {200: 3}
    print(f"resets: {tally.statuses}; ledger {totals}")


async def test_mid_stream_drop_ends_with_an_error_event_and_is_charged_what_was_streamed(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(spec(), sim.url)
    sim.faults(drop_after=3)
    bodies = [stream_chat(max_tokens=12) for _ in range(10)] + [chat(max_tokens=12)] * 5
    tally = await burst(gw, bodies, concurrency=15, keep_body=True)
    assert tally.statuses == {"stream_error": 10, 200: 5}, tally.statuses
    expected_failed_completion = 0
    for text in tally.bodies:
        if not text.startswith("data:"):
            continue
        events = sse_events(text)
        assert events[-1]["error"]["code"] == "stream_interrupted", events[-1]
        content = "".join(
            ev["choices"][0]["delta"].get("content") or "" for ev in events if ev.get("choices")
        )
        counter = TextCounter()
        counter.add(content)
        expected_failed_completion += counter.tokens
        assert sum(1 for ev in events if ev.get("choices")) >= 3
    quiescent(gw, sim)
    totals = assert_ledger_matches(gw, tally)  # the 5 plain answers, exactly
    assert (totals["requests"], totals["errors"]) == (15, 10)
    assert totals["failed_completion_tokens"] == expected_failed_completion
    assert totals["failed_prompt_tokens"] == 10 * chat_prompt_tokens(PING)  # the estimate
    metrics = gw.metrics()
    assert metric_sum(metrics, "tokengate_stream_errors_total") == 10
    assert (
        metric_sum(metrics, "tokengate_failed_tokens_total", kind="completion")
        == expected_failed_completion
    )
    print(f"drops: {tally.statuses}; ledger {totals}")


# -- processes dying ------------------------------------------------------------------------------
async def _steady_load(gw: Gateway, stop: asyncio.Event, workers: int = 6) -> Tally:
    tally = Tally()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def worker(n: int) -> None:
            i = 0
            while not stop.is_set():
                body = stream_chat(max_tokens=5) if (i + n) % 3 == 0 else chat(max_tokens=5)
                await send(session, gw, body, tally, keep_body=True)
                i += 1
                await asyncio.sleep(0.01)

        await asyncio.gather(*(worker(n) for n in range(workers)))
    return tally


@pytest.mark.slow
async def test_upstream_killed_and_restarted_on_the_same_port(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "20")
    gw = make_gateway(
        spec(
            breaker={"failure_threshold": 5, "open_sec": 0.5},
            health_check={"interval_sec": 1},
        ),
        sim.url,
    )
    stop = asyncio.Event()
    load = asyncio.ensure_future(_steady_load(gw, stop))
    await asyncio.sleep(1.0)
    sim.proc.kill()
    sim.proc.wait(5)
    await asyncio.sleep(1.5)
    restarted = await asyncio.to_thread(start_sim, "--latency-ms", "20", port=sim.port)
    try:
        # back to serving without a gateway restart (probe every 1 s, breaker 0.5 s)
        polls = Tally()
        deadline = time.monotonic() + PATIENCE
        async with aiohttp.ClientSession() as session:
            while polls.statuses.get(200, 0) == 0:
                assert time.monotonic() < deadline, "never recovered after the upstream came back"
                await send(session, gw, chat(max_tokens=5), polls, keep_body=True)
                await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        stop.set()
        tally = await load
        for status, n in polls.statuses.items():
            tally.statuses[status] = tally.statuses.get(status, 0) + n
        tally.prompt += polls.prompt
        tally.completion += polls.completion
        tally.bodies += polls.bodies
        tally.missing_retry_after += polls.missing_retry_after
        assert set(tally.statuses) <= {200, 502, 503, "stream_error"}, tally.statuses
        assert tally.statuses.get(502, 0) + tally.statuses.get(503, 0) > 0, tally.statuses
        assert tally.missing_retry_after == []
        codes = error_codes(tally)
        assert set(codes) <= {"upstream_error", "no_healthy_domain"}, codes
        quiescent(gw, restarted)
        totals = assert_ledger_matches(gw, tally)
        assert totals["requests"] == tally.total
        assert totals["errors"] == tally.total - tally.statuses[200]
        assert httpx.get(f"{gw.url}/health/ready").status_code == 200
        print(f"upstream kill/restart: {tally.statuses}; ledger {totals}")
    finally:
        restarted.stop()


async def test_redis_killed_and_restarted_keeps_serving_and_loses_no_ledger_row(
    sim: Sim, make_gateway: Make, redis: Redis
) -> None:
    s = spec()
    s.env = {"TOKENGATE_REDIS_URL": redis.url}
    gw = make_gateway(s, sim.url)
    before = await burst(gw, mixed(12))
    assert before.statuses == {200: 12}
    quiescent(gw, sim)
    assert_ledger_matches(gw, before)

    redis.kill()
    during = await burst(gw, mixed(24), concurrency=12, keep_body=True)
    assert during.statuses == {200: 24}, during.statuses  # fail-open: served
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["redis"]["up"] is False and ready["redis"]["state"] == "degraded"

    redis.start()
    wait_until(lambda: "tokengate_redis_up 1.0" in gw.metrics(), "Redis to be seen again")
    after = await burst(gw, mixed(12))
    assert after.statuses == {200: 12}
    quiescent(gw, sim)
    # The ledger is not in Redis: the restart (no persistence) loses no row.
    every = Tally(
        prompt=before.prompt + during.prompt + after.prompt,
        completion=before.completion + during.completion + after.completion,
    )
    totals = assert_ledger_matches(gw, every)
    assert (totals["requests"], totals["errors"]) == (48, 0)
    print(f"redis kill/restart: {before.statuses} {during.statuses} {after.statuses}; {totals}")


def test_sigterm_under_load_drains_in_flight_and_queued_work_and_exits_0(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "150", "--tokens-per-sec", "100")
    gw = make_gateway(
        spec(toml={"token_scheduler": {"max_inflight": 4, "queue_capacity": 64}}), sim.url
    )
    # 4 in flight, 16 queued behind them when the signal arrives (the upstream holds its
    # answers until then, so this holds on any machine); ~0.3 s of work each.
    bodies = mixed(20)

    def lined_up() -> bool:
        domain = httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]
        return bool(domain["inflight"] == 4 and domain["queue_depth"] == 16)

    def draining() -> bool:  # readiness says 503, or the listener is already closed
        try:
            return httpx.get(f"{gw.url}/health/ready").status_code == 503
        except httpx.TransportError:
            return True

    async def scenario() -> Tally:
        sim.faults(hold=True)  # the upstream answers nothing until the signal has landed
        task = asyncio.ensure_future(burst(gw, bodies, concurrency=20, keep_body=True))
        await eventually(lined_up, "4 requests in flight and 16 queued")
        gw.proc.send_signal(signal.SIGTERM)
        await eventually(draining, "the gateway to begin its drain")
        sim.faults()
        return await task

    tally = asyncio.run(scenario())
    assert tally.statuses == {200: 20}, tally.statuses
    assert gw.proc.wait(30) == 0
    assert sim.stats()["peak_inflight"] <= 4
    # The ledger was flushed at shutdown: a restarted gateway shows every answer billed.
    gw.restart()
    totals = ledger_totals(gw)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (
        tally.prompt,
        tally.completion,
    )
    assert (totals["requests"], totals["errors"]) == (20, 0)
    print(f"sigterm: {tally.statuses}, exit 0; ledger after restart {totals}")
