"""Overload: ten times the configured capacity at once, against real processes.

Capacity here is `max_inflight` (4) upstream plus `queue_capacity` (16) waiting, with an
upstream that takes ~50 ms per answer. A burst of 200 concurrent requests must end with
every client holding either its answer or a clear 429/503 carrying `Retry-After`; the
gateway itself never answers 5xx other than 503 (the upstream is healthy, so no 502/504);
the upstream never sees more than `max_inflight` at once; and the process gives back the
memory the burst took.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.e2e.chaos._support import (
    ADMIN,
    Make,
    Tally,
    assert_ledger_matches,
    burst,
    chat,
    quiescent,
    rss_mib,
    settle_rss,
)
from tests.support.procs import GatewaySpec, Sim

MAX_INFLIGHT = 4
QUEUE = 16
BURST = 200
RSS_TOLERANCE = 0.20


@pytest.mark.slow
async def test_ten_times_capacity_gets_answers_or_clear_refusals(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "50", "--no-record")
    gw = make_gateway(
        GatewaySpec(
            toml={"token_scheduler": {"max_inflight": MAX_INFLIGHT, "queue_capacity": QUEUE}},
            settings={"admin_key": ADMIN, "model_route": {"fallback": None}},
            keys={"alice": {"requests_per_minute": 100_000, "tokens_per_minute": 10**9}},
        ),
        sim.url,
    )
    pid = gw.proc.pid

    # Warm-up: the first overloads allocate what a steady process keeps (pools, caches).
    warm = Tally()
    for _ in range(3):
        t = await burst(gw, [chat() for _ in range(BURST)], concurrency=BURST)
        warm.prompt += t.prompt
        warm.completion += t.completion
    quiescent(gw, sim)
    before = settle_rss(pid)

    sim.clear()  # resets the upstream's peak_inflight to what is in flight now (0)
    tally = await burst(gw, [chat() for _ in range(BURST)], concurrency=BURST, keep_body=True)
    peak_during = rss_mib(pid)

    # Every request got an answer or a clear refusal; nothing else.
    assert tally.total == BURST
    assert set(tally.statuses) <= {200, 429, 503}, tally.statuses
    assert tally.statuses.get(200, 0) >= MAX_INFLIGHT + QUEUE, tally.statuses
    assert tally.missing_retry_after == [], "a 429/503 without Retry-After"
    for text in tally.bodies:
        body = json.loads(text)
        if "error" in body:
            assert body["error"]["code"] in {"queue_full", "queue_timeout", "rate_limit_exceeded"}
            assert body["error"]["message"]

    # The upstream never saw more than max_inflight of this domain at once.
    stats = sim.stats()
    assert stats["peak_inflight"] <= MAX_INFLIGHT, stats
    assert stats["statuses"] == {"200": tally.statuses[200]}, stats  # only answered ones went up

    # Nothing left behind, and the ledger billed exactly what was answered.
    status = quiescent(gw, sim)
    assert status["tasks"] == 0
    warm.prompt += tally.prompt
    warm.completion += tally.completion
    assert_ledger_matches(gw, warm)

    after = settle_rss(pid, 4.0)
    print(
        f"overload: {BURST} requests, {tally.statuses}; peak upstream inflight "
        f"{stats['peak_inflight']}; RSS {before:.1f} -> {peak_during:.1f} (burst) "
        f"-> {after:.1f} MiB"
    )
    assert after <= before * (1 + RSS_TOLERANCE), (
        f"RSS did not return within {RSS_TOLERANCE:.0%}: {before:.1f} -> {after:.1f} MiB"
    )
    assert gw.proc.poll() is None
