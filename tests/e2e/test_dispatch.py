"""The dispatch engine over real sockets: domains, batching, backpressure, priority,
fairness, disconnects and quota pacing (two `tokengate sim` upstreams as domains)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.procs import UPSTREAM_KEY, Gateway, GatewaySpec, Sim
from tests.support.scrape import buckets
from tests.support.waiting import eventually

Make = Callable[..., Gateway]


def body(model: str = "gpt-4o", tokens: int = 4, text: str = "ping") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens}


def domain(name: str, sim: Sim, **extra: object) -> dict[str, object]:
    return {"domain": name, "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY", **extra}


def histogram(metrics: str, name: str, domain: str) -> dict[float, float]:
    return buckets(metrics, name, domain=domain)


def ready_domain(gw: Gateway, domain: str = "domain-a") -> dict[str, Any]:
    return dict(httpx.get(f"{gw.url}/health/ready").json()["domains"][domain])


def queue_depth(gw: Gateway) -> int:
    return int(ready_domain(gw)["queue_depth"])


def inflight(gw: Gateway) -> int:
    return int(ready_domain(gw)["inflight"])


async def post_all(
    gw: Gateway, bodies: list[dict[str, object]], alias: str | None = None, timeout: float = 60
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=500)) as c:
        return list(
            await asyncio.gather(
                *(
                    c.post(f"{gw.url}/v1/chat/completions", json=b, headers=gw.headers(alias))
                    for b in bodies
                )
            )
        )


async def test_each_model_reaches_the_domain_serving_it(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    a, b = make_sim("--models", "model-a"), make_sim("--models", "model-b")
    gw = make_gateway(
        GatewaySpec(toml={"scale_up": [domain("dom-a", a, models=["model-a"]), domain("dom-b", b)]})
    )  # dom-b: discovered
    responses = await post_all(gw, [body("model-a"), body("model-b")] * 3)
    assert [r.status_code for r in responses] == [200] * 6
    served = Counter((r.json()["model"], r.headers["x-tokengate-domain"]) for r in responses)
    assert served == {("model-a", "dom-a"): 3, ("model-b", "dom-b"): 3}
    assert {r["body"]["model"] for r in a.records("/v1/chat/completions")} == {"model-a"}
    assert {r["body"]["model"] for r in b.records("/v1/chat/completions")} == {"model-b"}
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["domains"]["dom-b"]["models"] == ["model-b"]


async def test_batch_size_bounds_every_dispatch_group(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "50")
    # 8 slots for 32 requests: 24 queue and go out in groups as slots free up.
    toml = {"token_scheduler": {"batch_size": 4, "max_inflight": 8}}
    gw = make_gateway(GatewaySpec(toml=toml), sim.url)
    responses = await post_all(gw, [body() for _ in range(32)])
    assert all(r.status_code == 200 for r in responses)
    hist = histogram(gw.metrics(), "tokengate_batch_size", "domain-a")
    assert hist[float("inf")] > 8  # 32 requests went out in several groups...
    assert hist[4.0] == hist[float("inf")]  # ...none larger than batch_size
    assert len(sim.records("/v1/chat/completions")) == 32


async def test_queue_overflow_gets_503_with_retry_after_and_admitted_are_answered(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "300")
    gw = make_gateway(
        GatewaySpec(toml={"token_scheduler": {"max_inflight": 2, "queue_capacity": 5}}), sim.url
    )
    responses = await post_all(gw, [body() for _ in range(20)])
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) == {200, 503}  # nothing else fails
    assert statuses[200] == 7  # exactly 2 in flight + 5 queued were admitted
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "queue_full"
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert int(r.headers["retry-after-ms"]) > 0
    assert len(sim.records("/v1/chat/completions")) == statuses[200]


async def test_high_priority_overtakes_a_low_priority_backlog(sim: Sim, make_gateway: Make) -> None:
    """The upstream holds its answers while the backlog lines up: one low request in
    flight, the rest queued, then the vip request; released, the vip goes next. Nothing
    here depends on how fast the machine runs."""
    gw = make_gateway(
        GatewaySpec(
            toml={"token_scheduler": {"max_inflight": 1}},
            keys={"bulk": {"priority": "low"}, "vip": {"priority": "high"}},
        ),
        sim.url,
    )
    sim.faults(hold=True)
    low = asyncio.ensure_future(post_all(gw, [body(text=f"low {i}") for i in range(20)], "bulk"))
    await eventually(lambda: queue_depth(gw) == 19, "one low request in flight, 19 queued")
    high = asyncio.ensure_future(post_all(gw, [body(text="vip")], "vip"))
    await eventually(lambda: queue_depth(gw) == 20, "the vip request queued behind the upstream")
    sim.faults()  # the upstream answers again
    assert [r.status_code for r in await high] == [200]
    assert [r.status_code for r in await low] == [200] * 20
    order = [r["body"]["messages"][0]["content"] for r in sim.records("/v1/chat/completions")]
    assert order.index("vip") == 1, order  # behind only the one already in flight


async def test_two_equal_keys_flooding_share_within_ten_percent(
    sim: Sim, make_gateway: Make
) -> None:
    """Both floods line up behind a held upstream (two in flight, 78 queued) before any
    is answered, so the order they are served in is the queue's, not the client's."""
    gw = make_gateway(
        GatewaySpec(toml={"token_scheduler": {"max_inflight": 2}}, keys={"k1": {}, "k2": {}}),
        sim.url,
    )
    sim.faults(hold=True)
    floods = asyncio.ensure_future(
        asyncio.gather(
            post_all(gw, [body(text="k1")] * 40, "k1"), post_all(gw, [body(text="k2")] * 40, "k2")
        )
    )
    await eventually(lambda: queue_depth(gw) == 78, "both floods queued")
    sim.faults()
    assert all(r.status_code == 200 for flood in await floods for r in flood)
    first = [r["body"]["messages"][0]["content"] for r in sim.records("/v1/chat/completions")][:40]
    shares = Counter(first)
    assert abs(shares["k1"] - shares["k2"]) <= 4, shares


async def test_client_that_leaves_while_queued_never_reaches_upstream(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(toml={"token_scheduler": {"max_inflight": 1}}), sim.url)
    sim.faults(hold=True)  # "first" stays in flight until the queued one has left
    async with httpx.AsyncClient(timeout=60) as c:
        first = asyncio.ensure_future(
            c.post(f"{gw.url}/v1/chat/completions", json=body(text="first"), headers=gw.headers())
        )
        await eventually(lambda: sim.stats()["inflight"] == 1, "the first request upstream")
        gone = asyncio.ensure_future(
            c.post(f"{gw.url}/v1/chat/completions", json=body(text="gone"), headers=gw.headers())
        )
        await eventually(lambda: queue_depth(gw) == 1, "the second request queued")
        gone.cancel()  # the client leaves: its connection is closed
        with pytest.raises(asyncio.CancelledError):
            await gone
        await eventually(lambda: queue_depth(gw) == 0, "the gateway to drop the queued request")
        sim.faults()
        assert (await first).status_code == 200
    await eventually(lambda: inflight(gw) == 0, "the slot to be free")
    sent = [r["body"]["messages"][0]["content"] for r in sim.records("/v1/chat/completions")]
    assert sent == ["first"]


async def test_pacing_to_the_domain_quota_avoids_upstream_429(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    # 120 requests/min with a 2 s window: a burst of 4, then 2 per second, on both sides.
    sim = make_sim("--rpm", "120", "--quota-window-sec", "2")
    gw = make_gateway(
        GatewaySpec(
            toml={"scale_up": [domain("paced", sim, requests_per_minute=120, quota_window_sec=2)]}
        )
    )
    started = time.monotonic()
    responses = await post_all(gw, [body() for _ in range(12)])
    elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200] * 12
    assert sim.stats()["statuses"] == {"200": 12}  # the upstream never had to say 429
    assert elapsed >= 3.5  # (12 - 4) / 2 per second: the gateway waited, it did not reject


def test_upstream_key_per_domain(make_sim: Callable[..., Sim], make_gateway: Make) -> None:
    a = make_sim("--models", "model-a", api_key="sk-domain-a")
    b = make_sim("--models", "model-b", api_key="sk-domain-b")
    gw = make_gateway(
        GatewaySpec(
            toml={
                "scale_up": [
                    domain("a", a, api_key_env="KEY_A"),
                    domain("b", b, api_key_env="KEY_B"),
                ]
            },
            env={"KEY_A": "sk-domain-a", "KEY_B": "sk-domain-b"},
        )
    )
    client = gw.openai()
    for model in ("model-a", "model-b"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert a.records("/v1/chat/completions")[0]["headers"]["authorization"] == "Bearer sk-domain-a"
    assert b.records("/v1/chat/completions")[0]["headers"]["authorization"] == "Bearer sk-domain-b"
    assert UPSTREAM_KEY not in str(a.records()) + str(b.records())
