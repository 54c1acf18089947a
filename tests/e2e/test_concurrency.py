"""Per-key max_concurrent over real sockets: two replicas sharing Redis hold a key to its
cap together, queue (never refuse) what is over it, and learn a live cap set on either."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from tests.support.procs import Gateway, GatewaySpec, Redis, Sim
from tests.support.waiting import wait_until

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
SECRET = "tg-agents-fan-out-0123456789"


async def fan_out(replicas: list[Gateway], n: int) -> list[int]:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    f"{replicas[i % len(replicas)].url}/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {SECRET}"},
                )
                for i in range(n)
            )
        )
    return [r.status_code for r in answers]


def agent_cap(gw: Gateway) -> int:
    status = httpx.get(f"{gw.url}/admin/status", headers={"authorization": f"Bearer {ADMIN}"})
    (agent,) = [k for k in status.json()["limits"]["keys"] if k["alias"] == "agent"]
    return int(agent["max_concurrent"])


async def test_two_replicas_hold_a_key_to_its_cap_together_and_queue_the_rest(
    make_sim: Callable[..., Sim], make_gateway: Make, redis: Redis
) -> None:
    sim = make_sim("--latency-ms", "300")
    spec = GatewaySpec(
        keys={"agent": {"max_concurrent": 2}},
        secrets={"agent": SECRET},
        settings={"admin_key": ADMIN},
        env={"TOKENGATE_REDIS_URL": redis.url},
    )
    replicas = [make_gateway(spec, sim.url), make_gateway(spec, sim.url)]
    assert await fan_out(replicas, 6) == [200] * 6  # none refused
    assert sim.stats()["peak_inflight"] == 2
    metrics = replicas[0].metrics() + replicas[1].metrics()
    assert metrics.count('tokengate_key_concurrency_waits_total{key="agent",outcome="granted"}')

    r = httpx.put(
        f"{replicas[0].url}/admin/keys/agent/limits",
        json={"max_concurrent": 1},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 200 and r.json()["max_concurrent"] == 1
    # the other replica reads live caps once a second
    wait_until(lambda: agent_cap(replicas[1]) == 1, "the other replica to read the live cap")
    sim.clear()
    assert await fan_out(replicas, 4) == [200] * 4
    assert sim.stats()["peak_inflight"] == 1
