"""Soak: a bounded run of >= 50k requests through one gateway, counting what leaks.

Mixed traffic at a fixed concurrency: plain chat calls, streams (with
`stream_options.include_usage`, so the client sees the usage it is billed), and clients
that hang up mid-stream. Normal traffic uses `gpt-4o` on a domain whose upstream answers
as fast as it can; the hang-ups use `claude-sonnet` on a second domain whose upstream
paces long answers (so the hang-up is really mid-stream), and the ledger keeps them on
their own row: the billed usage of the completed calls is compared exactly with what the
clients received.

Speed: on the 2-core test machine the gateway costs ~1.4 ms of CPU per request and the
three processes share the two cores, so the run is bound at ~500 requests/s.

Afterwards the process must be back where it was: RSS growth under `RSS_BOUND_MIB`
after warm-up, no gateway task, queued or in-flight request left (`/admin/status`,
`tokengate_inflight`), no upstream request still open (the simulator's inflight), and no
file descriptors piling up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.e2e.chaos._support import (
    ADMIN,
    Make,
    Tally,
    assert_ledger_matches,
    chat,
    ledger_totals,
    metric_sum,
    open_fds,
    quiescent,
    rss_mib,
    send,
    settle_rss,
    stream_chat,
)
from tests.support.procs import Gateway, GatewaySpec, Sim

TOTAL = 50_000
WARMUP = 2_000
CONCURRENCY = 64
RSS_BOUND_MIB = 60.0
FD_SLACK = 2 * CONCURRENCY + 16  # keep-alive pools on both sides, and the log/ledger files
HANGUP_EVERY = 100  # 1% of the requests hang up mid-stream
STREAM_EVERY = 5  # 20% stream


def body_for(i: int) -> dict[str, Any]:
    if i % HANGUP_EVERY == 0:
        return stream_chat("claude-sonnet", max_tokens=400)
    if i % STREAM_EVERY == 0:
        return stream_chat(max_tokens=6)
    return chat(max_tokens=6)


async def hang_up(session: aiohttp.ClientSession, gw: Gateway, tally: Tally) -> None:
    """Read the first events of a long stream, then drop the connection."""
    try:
        async with session.post(
            f"{gw.url}/v1/chat/completions",
            json=body_for(0),
            headers={**gw.headers(), "connection": "close"},
        ) as r:
            assert r.status == 200, r.status
            for _ in range(3):
                await r.content.readline()
            r.close()
        tally.count("hung_up")
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.count(type(exc).__name__)


async def run(gw: Gateway, start: int, count: int) -> Tally:
    tally = Tally()
    queue = iter(range(start, start + count))
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as session:

        async def worker() -> None:
            for i in queue:
                if i % HANGUP_EVERY == 0:
                    await hang_up(session, gw, tally)
                else:
                    await send(session, gw, body_for(i), tally)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return tally


@pytest.mark.slow
async def test_soak_50k_mixed_requests_leaks_nothing(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    fast = make_sim("--no-record", "--models", "gpt-4o")
    slow = make_sim(
        "--no-record",
        "--models",
        "claude-sonnet",
        "--tokens-per-sec",
        "200",
        "--reply-tokens",
        "400",
    )
    domains = [
        {"domain": "fast", "api_base": fast.url, "models": ["gpt-4o"]},
        {"domain": "slow", "api_base": slow.url, "models": ["claude-sonnet"]},
    ]
    gw = make_gateway(
        GatewaySpec(
            toml={"scale_up": domains},
            settings={"admin_key": ADMIN, "model_route": {"fallback": None}},
            keys={"alice": {"requests_per_minute": 100_000_000, "tokens_per_minute": 10**12}},
        )
    )
    pid = gw.proc.pid

    warm = await run(gw, 1, WARMUP)
    assert set(warm.statuses) <= {200, "hung_up"}, warm.statuses
    quiescent(gw, fast)
    rss_before, fds_before = settle_rss(pid, 2.0), open_fds(pid)

    started = time.monotonic()
    tally = await run(gw, WARMUP + 1, TOTAL)
    elapsed = time.monotonic() - started
    rss_peak = rss_mib(pid)

    hung_up = tally.statuses.get("hung_up", 0)
    assert tally.total == TOTAL
    assert set(tally.statuses) <= {200, "hung_up"}, tally.statuses
    assert hung_up == TOTAL // HANGUP_EVERY

    # Nothing left behind: tasks, queues, in-flight slots, upstream requests, sockets.
    status = quiescent(gw, fast)
    quiescent(gw, slow)
    assert status["tasks"] == 0
    for name, domain in status["domains"].items():
        assert (domain["inflight"], domain["queue_depth"]) == (0, 0), name
    metrics = gw.metrics()  # gauges are read when scraped
    assert metric_sum(metrics, "tokengate_inflight") == 0
    assert metric_sum(metrics, "tokengate_queue_depth") == 0
    assert (fast.stats()["inflight"], slow.stats()["inflight"]) == (0, 0)
    fds_after = open_fds(pid)
    assert fds_after <= fds_before + FD_SLACK, (fds_before, fds_after)

    # The ledger billed exactly the usage of the completed answers; hang-ups apart.
    warm_and_run = Tally(prompt=warm.prompt + tally.prompt)
    warm_and_run.completion = warm.completion + tally.completion
    served = warm.statuses.get(200, 0) + tally.statuses[200]
    totals = assert_ledger_matches(gw, warm_and_run, "gpt-4o")
    assert (totals["requests"], totals["errors"]) == (served, 0)
    hangups = ledger_totals(gw, "claude-sonnet")
    total_hangups = hung_up + warm.statuses.get("hung_up", 0)
    assert hangups["requests"] == hangups["errors"] == total_hangups
    assert hangups["completion_tokens"] == 0  # nothing billed as a success
    # charged what was streamed: at least the chunks each client read, never the whole 400
    assert total_hangups <= hangups["failed_completion_tokens"] < total_hangups * 400

    rss_after = settle_rss(pid, 3.0)
    print(
        f"soak: {TOTAL} requests in {elapsed:.1f}s ({TOTAL / elapsed:.0f}/s), {tally.statuses}; "
        f"RSS {rss_before:.1f} -> {rss_peak:.1f} (end of run) -> {rss_after:.1f} MiB; "
        f"fds {fds_before} -> {fds_after}; ledger {totals}; hang-ups {hangups}"
    )
    assert rss_after - rss_before < RSS_BOUND_MIB, (rss_before, rss_after)
    assert gw.proc.poll() is None
