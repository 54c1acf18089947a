"""The gateway and the official SDK share one retry budget (no retry amplification)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
PING = [{"role": "user", "content": "ping"}]
NO_FALLBACK = {"model_route": {"fallback": None}}


def test_sdk_does_not_repeat_the_gateways_retries(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={"retry_policy": {"max_attempts": 3, "backoff_ms": 10}, **NO_FALLBACK}
        ),
        sim.url,
    )
    sim.faults(status=500, rate=1.0)
    client = gw.openai(max_retries=2)  # the SDK's default
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=2)
    assert err.value.status_code == 502
    assert len(sim.records("/v1/chat/completions")) == 3  # not 3 x 3
    assert len(gw.access()) == 1  # the SDK asked the gateway once


def test_client_mode_leaves_retries_to_the_sdk(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={
                "retry_policy": {"max_attempts": 3, "client_retries": "client", "backoff_ms": 10},
                **NO_FALLBACK,
            }
        ),
        sim.url,
    )
    sim.faults(status=500, rate=1.0)
    with pytest.raises(openai.InternalServerError):
        gw.openai(max_retries=2).chat.completions.create(model="gpt-4o", messages=PING)
    assert len(sim.records("/v1/chat/completions")) == 3  # 1 gateway attempt x 3 SDK tries
    assert len(gw.access()) == 3


def test_sdk_waits_the_advertised_refill_and_succeeds(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(keys={"k": {"requests_per_minute": 60}}), sim.url)
    hints: list[float] = []  # the Retry-After of each 429 the SDK saw (and then retried)

    def heard(response: httpx.Response) -> None:
        if response.status_code == 429:
            hints.append(float(response.headers["retry-after-ms"]) / 1000)

    client = gw.openai(max_retries=2, http_client=httpx.Client(event_hooks={"response": [heard]}))
    # Call until one call meets the empty bucket (a slow machine refills while we fill it).
    for _ in range(120):
        refused_before = sum(1 for line in gw.access() if line["status"] == 429)
        started = time.monotonic()
        answer = client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=1)
        waited = time.monotonic() - started
        refused = sum(1 for line in gw.access() if line["status"] == 429) - refused_before
        if refused:
            break
    else:
        pytest.fail("the bucket never emptied")
    assert answer.choices  # the caller never saw the 429: the SDK retried after the hint
    # It waited what it was told (the time until the bucket holds one more request: at
    # most a second at 60/min, less when the bucket was nearly refilled), and that was
    # enough: one 429, then the retry succeeded (however slowly the machine ran, a longer
    # wait only refills more, so no upper bound on the wait is asserted).
    assert hints and 0 < hints[-1] <= 1.0, hints
    assert hints[-1] <= waited and refused == 1, (waited, hints, refused)
    client.close()
    assert [line["status"] for line in gw.access()][-2:] == [429, 200]
