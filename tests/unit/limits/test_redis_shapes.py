"""Each Redis deployment operators run, for real on loopback, behind the same store: one
server with a password, TLS (CA, client certificate), a unix socket, Sentinel (through
a failover), and a three-master Cluster. Each must hold a limit exactly, pace, announce
the replica and keep live limits, with no error and no fallback to local limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from app.config.schema import RedisConfig
from app.limits.bucket import Limits
from app.limits.pacing import PaceState
from app.limits.shared_store import SharedStore
from tests.support.redis_shapes import cluster, sentinel_setup, server
from tests.support.tls import certificate
from tests.unit.limits.test_shared_store import Tasks

LIMITS = Limits(requests_per_minute=20, tokens_per_minute=100_000)
Make = Callable[..., Any]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    made: list[SharedStore] = []
    tasks = Tasks()

    async def build(**fields: Any) -> SharedStore:
        store = SharedStore.from_config(RedisConfig(**fields), spawn=tasks.spawn, on_state=None)
        made.append(store)
        await store.start()
        return store

    yield build
    await tasks.idle()
    for store in made:
        await store.close()


async def exercise(store: SharedStore, keys: tuple[str, ...] = ("k",)) -> None:
    """What a gateway does with its store, checked: every key's limit exact under a burst,
    a paced domain booked, the heartbeat, a live limit seen by the next read."""
    assert store.engine.state() == "shared", store.describe()
    for key in keys:
        burst = await asyncio.gather(*(store.reserve(key, LIMITS, 10) for _ in range(30)))
        assert sum(d.allowed for d in burst) == 20, key
        store.settle(key, LIMITS, -10, -1)  # one refunded: room for exactly one more
        await asyncio.sleep(0.02)
        assert [(await store.reserve(key, LIMITS, 1)).allowed for _ in range(2)] == [True, False]
    pacer = store.pacer(f"d-{keys[0]}", PaceState(600, None, 1.0))
    waits = await asyncio.gather(*(pacer.reserve(1, 0) for _ in range(12)))
    assert waits[0] == 0 and max(waits) > 0  # spaced by the shared pace
    await store.housekeeping()  # the heartbeat
    assert store.fallback.replicas >= 1 and store.engine.replica_id in await store.replicas()
    assert store.engine.state() == "shared", store.describe()


async def test_one_server_with_a_password_kept_out_of_the_url(make: Make, tmp_path: Path) -> None:
    s = server(tmp_path, password="s3cret-pass")
    try:
        plain = f"redis://127.0.0.1:{s.port}/0"
        await exercise(await make(url=plain, password="s3cret-pass"))
        wrong = await make(url=plain, password="not-it")
        assert wrong.engine.state() == "degraded"  # refused (WRONGPASS): an outage, never a 500
        assert "not-it" not in str(wrong.describe())
    finally:
        s.kill()


async def test_tls_with_a_ca_and_a_client_certificate(make: Make, tmp_path: Path) -> None:
    cert = certificate()
    s = server(tmp_path, tls=cert, client_certs=True)
    try:
        tls = {"tls_ca_file": str(cert.ca)}
        mine = {"tls_cert_file": str(cert.cert), "tls_key_file": str(cert.key)}
        fresh = await make(url=s.url, **tls, **mine)
        # A burst right after start, on fresh TLS connections: it used to trip fail open.
        burst = await asyncio.gather(*(fresh.reserve("b", LIMITS, 1) for _ in range(500)))
        assert sum(d.allowed for d in burst) == 20 and fresh.engine.state() == "shared"
        await exercise(fresh)
        no_client_cert = await make(url=s.url, **tls)
        assert no_client_cert.engine.state() == "degraded"  # the server demands one
        untrusted = await make(url=s.url, **mine)  # the system CAs do not know this server
        assert untrusted.engine.state() == "degraded"
    finally:
        s.kill()


async def test_a_unix_socket(make: Make, tmp_path: Path) -> None:
    s = server(tmp_path, unix=True)
    try:
        store = await make(url=s.url)
        assert store.describe()["where"] == f"unix socket {tmp_path}/redis.sock (db 0)"
        await exercise(store)
    finally:
        s.kill()


async def test_sentinel_follows_the_master_through_a_failover(make: Make, tmp_path: Path) -> None:
    with sentinel_setup(tmp_path) as setup:
        store = await make(url=setup.url)
        await exercise(store)
        before = setup.master_port()
        setup.failover()
        assert setup.master_port() != before
        # The first calls after the switch may find the old master (now a replica) and
        # count as a short outage; the heartbeat finds the new master.
        for _ in range(50):
            await store.reserve("after", LIMITS, 1)
            await store.housekeeping()
            if store.engine.state() == "shared":
                break
            await asyncio.sleep(0.1)
        await exercise(store, keys=("after-failover",))
        fields = await make(
            sentinels=[f"127.0.0.1:{s.port}" for s in setup.sentinels],
            sentinel_service=setup.service,
        )
        assert fields.describe()["shape"] == "sentinel"
        await exercise(fields, keys=("fields",))


async def test_a_three_master_cluster_with_keys_on_every_node(make: Make, tmp_path: Path) -> None:
    with cluster(tmp_path) as c:
        store = await make(url=c.url)
        keys = ("alice", "bob", "carol", "dave", "erin", "frank")
        owners = {c.slot_owner(f"tokengate:rl:{{{k}}}:tokens") for k in keys}
        assert len(owners) == 3  # the keys really land on all three masters
        await exercise(store, keys=keys)
        seeded = await make(url=f"redis://127.0.0.1:{c.nodes[1].port}", cluster=True)
        await exercise(seeded, keys=("zoe",))
