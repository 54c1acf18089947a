"""Upstream 429s through the pipeline in-process (httpx MockTransport upstream): flow
control that neither fails the request nor feeds the breaker or the retry budget, and
an empty balance that is answered at once."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.errors import ServiceUnavailable, UpstreamQuotaExhausted
from app.gateway import Gateway
from app.metrics import Metrics, new_registry
from app.pipeline.answer import StreamAnswer
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from app.runtime import compile_runtime
from tests.support.inproc import CHAT_OK, Handler, MakeGateway, local_settings

SETTINGS = {
    "model_route": {"default": "m-1", "fallback": None},
    "retry_policy": {"max_attempts": 3, "backoff_ms": 1},
    "breaker": {"failure_threshold": 2},
    "scale_up": {"models": ["m-1"]},
}
EMPTY = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


@pytest.fixture
def make(make_local_gateway: MakeGateway) -> Callable[..., Gateway]:
    def build(handler: Handler, **extra: object) -> Gateway:
        return make_local_gateway({**SETTINGS, **extra}, handler=handler)

    return build


async def ask(gw: Gateway) -> JsonAnswer | StreamAnswer:
    await gw.start()
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    call = parse_call(CHAT, raw, gw.keys.anonymous, "req_t", {}, time.perf_counter())
    return await gw.pipeline.handle(call)


def throttles(gw: Gateway) -> float:
    value = gw.metrics.registry.get_sample_value(
        "tokengate_upstream_throttled_total", {"domain": "default"}
    )
    return value or 0.0


async def test_429s_are_waited_out_without_touching_the_breaker_or_the_budget(
    make: Callable[..., Gateway],
) -> None:
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(time.monotonic())
        if len(sent) <= 3:  # more 429s than max_attempts and than the breaker's threshold
            return httpx.Response(429, json={"error": {}}, headers={"retry-after-ms": "60"})
        return httpx.Response(200, json=CHAT_OK)

    gw = make(handler)
    answer = await ask(gw)
    assert isinstance(answer, JsonAnswer) and answer.status == 200
    assert len(sent) == 4
    # Each 429 cooled the domain down for the advertised 60 ms before the next went.
    assert all(b - a >= 0.055 for a, b in itertools.pairwise(sent))
    domain = gw.domains[0]
    assert domain.breaker.state == "closed" and domain.breaker.consecutive == 0
    assert domain.budget.snapshot() == {"requests": 1, "retries": 0}
    assert throttles(gw) == 3
    retries = gw.metrics.registry.get_sample_value(
        "tokengate_upstream_retries_total", {"domain": "default", "reason": "throttled"}
    )
    assert retries is None


async def test_a_bare_429_learns_a_rate_and_shows_the_domain_throttled(
    make: Callable[..., Gateway],
) -> None:
    answers = iter([429])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(answers, 200)
        return httpx.Response(status, json=CHAT_OK if status == 200 else {"error": {}})

    gw = make(handler)
    assert (await ask(gw)).status == 200  # after the 1 s header-less cool-down
    pace = gw.domains[0].dispatcher.pacer
    assert pace.rate() is not None  # was unbounded; now learned from what was accepted
    snapshot = pace.snapshot()
    assert snapshot["learned"] is True and snapshot["shared"] is False


async def test_a_cool_down_longer_than_the_queue_wait_is_503_at_once(
    make: Callable[..., Gateway],
) -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(429, json={"error": {}}, headers={"retry-after": "45"})

    gw = make(handler)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as refused:
        await ask(gw)
    assert time.monotonic() - started < 1.0 and calls == [1]
    assert refused.value.code == "upstream_rate_limited"
    assert 1 <= int(refused.value.response_headers()["retry-after"]) <= 60
    assert gw.domains[0].state() == "throttled"
    assert gw.domains[0].breaker.state == "closed"


async def test_an_empty_balance_is_one_attempt_and_a_top_up_clears_it(
    make: Callable[..., Gateway],
) -> None:
    balance = {"empty": True}
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if balance["empty"]:
            return httpx.Response(429, json=EMPTY, headers={"retry-after": "1"})
        return httpx.Response(200, json=CHAT_OK)

    gw = make(handler)
    with pytest.raises(UpstreamQuotaExhausted) as refused:
        await ask(gw)
    assert calls == [1]  # no retry, no wait: waiting does not refill a balance
    headers = refused.value.response_headers()
    assert headers["x-should-retry"] == "false" and "retry-after" not in headers
    domain = gw.domains[0]
    assert domain.state() == "quota_exhausted" and domain.available()
    assert domain.breaker.consecutive == 0
    balance["empty"] = False
    assert (await ask(gw)).status == 200  # the next request after a top-up is served
    assert domain.state() != "quota_exhausted"


async def test_advertised_limits_pace_the_domain_before_any_429(
    make: Callable[..., Gateway],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {
            "x-ratelimit-limit-requests": "120",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "250ms",
        }
        return httpx.Response(200, json=CHAT_OK, headers=headers)

    gw = make(handler)
    assert (await ask(gw)).status == 200
    pacer = gw.domains[0].dispatcher.pacer
    assert pacer.rate() == pytest.approx(120 / 60 * 0.98)
    assert 0 < pacer.cooling() <= 0.25  # nothing left until the reset: paused, no 429 needed
    assert throttles(gw) == 0


def test_without_redis_each_worker_paces_its_share_of_the_domain_quota(
    tmp_path: Path,
) -> None:
    settings = local_settings(tmp_path, {"scale_up": {"requests_per_minute": 600}})
    for workers, share in ((1, 600), (4, 150)):
        runtime = compile_runtime(
            settings, {"TAOTOKEN_API_KEY": "k"}, no_auth=True, workers=workers
        )
        gw = Gateway(runtime, Metrics(new_registry()))
        # 98 % of the share, per second: four workers together stay under the quota.
        assert gw.domains[0].dispatcher.pacer.rate() == pytest.approx(share / 60 * 0.98)


async def test_a_failure_while_recording_a_429_gives_the_slot_back(
    make: Callable[..., Gateway],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": {}})

    gw = make(handler)
    pacer = gw.domains[0].dispatcher.pacer

    async def broken(throttle: object) -> float:
        raise RuntimeError("shared state unreachable")

    pacer.throttled = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await ask(gw)
    assert gw.domains[0].dispatcher.inflight == 0  # not leaked: max_inflight stays whole
