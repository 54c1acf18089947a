"""The one door to redis-py: a client for the configured shape, and calls through it.

    RedisTarget (app/config/redis_target.py)      standalone (TCP, TLS, unix socket),
        │ connect()                                Sentinel (follows the master), Cluster
        ▼
    RedisLink.run([Call, ...]) -> [result | exception, ...]    one pipeline, one round trip
                                                              per node

Scripts are called by SHA (`EVALSHA`); a Redis that lacks one (never loaded, or its
script cache lost in a restart, a promoted replica, a new cluster primary) answers
NOSCRIPT, and the scripts known so far are loaded and those calls repeated, once. Every
script's keys share one hash tag, so in a Cluster each call lands on one node and no call
is ever cross-slot.

`classify` turns whatever a call raised into what it means for the store: a
configuration error (MOVED / ASK / CROSSSLOT: a cluster reached as a single server, or
keys that straddle slots), an outage (refused, reset, loading, read-only after a
failover), slowness (a timeout), or something unexpected (a bug, here or in the client).
Messages built here never carry a password; `RedisTarget.where()` is what may be shown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from app.config.redis_target import RedisTarget
from app.config.schema import RedisConfig
from app.state.scripts import Script

log = logging.getLogger("tokengate.redis")


class RedisFault(Enum):
    CONFIG = "misconfigured"  # never fixes itself: reported once, served by the fail mode
    DOWN = "down"  # unreachable now: the fail mode until it answers again
    SLOW = "slow"  # a timeout: may be this process lagging; several in a row are an outage
    BUG = "unexpected"  # counted like a timeout, logged with its traceback once per kind


class ClusterAsServerError(Exception):
    """A Cluster node reached as a single server (found at start, before any MOVED)."""


_CONFIG = (rx.AskError, rx.ClusterCrossSlotError, ClusterAsServerError)  # MOVED is an ASK
_DOWN = (
    rx.ConnectionError,  # refused, reset, LOADING, auth, max clients
    rx.ClusterDownError,
    rx.TryAgainError,
    rx.ReadOnlyError,  # a master demoted by a failover
    rx.RedisClusterException,
    OSError,
)


def classify(exc: BaseException) -> RedisFault:
    if isinstance(exc, _CONFIG) or _cross_slot(exc):
        return RedisFault.CONFIG
    if isinstance(exc, rx.TimeoutError | TimeoutError):
        return RedisFault.SLOW
    if isinstance(exc, _DOWN):
        return RedisFault.DOWN
    return RedisFault.BUG


def _cross_slot(exc: BaseException) -> bool:
    # redis-py's cluster client refuses a multi-slot script itself, before sending it
    text = str(exc)
    return isinstance(exc, rx.RedisClusterException) and "same key slot" in text


def describe(exc: BaseException) -> str:
    """A failure for a log line: the kind and redis-py's text (which names no password)."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"


@dataclass(frozen=True, slots=True)
class Call:
    """One command of a pipeline: a script, or a plain command (`script=None`)."""

    script: Script | None
    keys: tuple[str, ...]
    args: tuple[Any, ...]

    def command(self, shas: Shas) -> tuple[Any, ...]:
        if self.script is None:
            return self.args
        return ("EVALSHA", shas[self.script], len(self.keys), *self.keys, *self.args)


class Shas(dict[Script, str]):
    """Each script's SHA, computed the first time a call names it."""

    def __missing__(self, script: Script) -> str:
        sha = self[script] = script.sha()
        return sha


class RedisLink:
    """A connected client and the scripts; `run` is the only way calls reach Redis."""

    def __init__(self, client: Any, target: RedisTarget, *others: Any) -> None:
        self.client = client
        self.target = target
        self._others = others  # clients to close with it (the Sentinels)
        self.cluster = isinstance(client, RedisCluster)
        self.shas = Shas()

    def know(self, *scripts: Script) -> None:
        """Scripts to load at `start` (so no first call of theirs meets NOSCRIPT)."""
        for script in scripts:
            _ = self.shas[script]

    async def start(self, warm: int = 2) -> None:
        """Connect (opening `warm` connections, so the first burst finds them ready and
        no request waits on a TLS handshake), refuse a cluster reached as a single
        server, load the scripts known so far. Raises what redis-py raised."""
        if self.cluster:
            await self.client.initialize()
        else:
            await asyncio.gather(*(self.client.ping() for _ in range(max(1, warm))))
            info = await self.client.info("cluster")
            if int(info.get("cluster_enabled", 0)):
                raise ClusterAsServerError("this Redis is a Cluster node, configured as one server")
        await self.load_scripts()

    async def load_scripts(self) -> None:
        for script in list(self.shas):
            await self.client.script_load(script.source())  # Cluster: on every primary

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """Every call in one round trip (per node), results in order. A call's own error
        is its result (an exception instance); a failure of the whole raises."""
        results = await self._send(calls)
        again = [i for i, r in enumerate(results) if isinstance(r, rx.NoScriptError)]
        if again:
            await self.load_scripts()
            for i, result in zip(again, await self._send([calls[i] for i in again]), strict=True):
                results[i] = result
        return results

    async def _send(self, calls: Sequence[Call]) -> list[Any]:
        if len(calls) == 1:
            try:
                return [await self.client.execute_command(*calls[0].command(self.shas))]
            except rx.ResponseError as exc:  # the call's own answer, as in a pipeline
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.command(self.shas))
        return list(await pipe.execute(raise_on_error=False))

    async def ping(self) -> None:
        await self.client.ping()

    async def hset(self, key: str, field: str, value: str) -> None:
        await self.client.hset(key, field, value)

    async def close(self) -> None:
        for client in (self.client, *self._others):
            await client.aclose()


def connect(cfg: RedisConfig) -> RedisLink:
    """A client for the configured Redis (nothing is connected before `start`)."""
    target = cfg.target()
    assert target is not None, "Redis is not configured"
    common: dict[str, Any] = {
        "socket_timeout": cfg.timeout_ms / 1000,
        "socket_connect_timeout": cfg.connect_timeout_ms / 1000,
        "decode_responses": True,
        "client_name": "tokengate",
        "username": target.username,
        "password": target.password,
    }
    # One immediate retry on a broken connection (a pooled socket that a Redis restart
    # closed; with Cluster, after re-reading the topology); none on a timeout, which the
    # store counts instead.
    common["retry"] = Retry(NoBackoff(), 1, supported_errors=(rx.ConnectionError,))
    tls = _tls(cfg) if target.tls else {}
    flagged = {"ssl": True, **tls} if target.tls else {}  # clients that pick SSL by a flag
    if target.shape == "cluster":
        nodes = [ClusterNode(host, port) for host, port in target.hosts]
        client: Any = RedisCluster(
            startup_nodes=nodes,
            max_connections=cfg.max_connections,  # a redirect (MOVED) is followed inside
            **common,
            **flagged,
        )
        return RedisLink(client, target)
    if target.shape == "sentinel":
        sentinel_auth = cfg.sentinel_password
        sentinel = Sentinel(
            list(target.hosts),
            sentinel_kwargs={
                "password": None if sentinel_auth is None else sentinel_auth.get_secret_value(),
                "socket_timeout": cfg.timeout_ms / 1000,
                "socket_connect_timeout": cfg.connect_timeout_ms / 1000,
                **flagged,
            },
            db=target.db,
            **common,
            **flagged,
        )
        assert target.service is not None
        client = sentinel.master_for(target.service, max_connections=cfg.max_connections)
        return RedisLink(client, target, *sentinel.sentinels)
    pool_kwargs: dict[str, Any] = {"db": target.db, "max_connections": cfg.max_connections}
    if target.unix_path is not None:
        pool = aioredis.ConnectionPool(
            connection_class=aioredis.UnixDomainSocketConnection,
            path=target.unix_path,
            **pool_kwargs,
            **common,
        )
    else:
        host, port = target.hosts[0]
        connection = aioredis.SSLConnection if target.tls else aioredis.Connection
        pool = aioredis.ConnectionPool(
            connection_class=connection, host=host, port=port, **pool_kwargs, **common, **tls
        )
    return RedisLink(aioredis.Redis.from_pool(pool), target)


def _tls(cfg: RedisConfig) -> dict[str, Any]:
    return {
        "ssl_ca_certs": cfg.tls_ca_file,
        "ssl_certfile": cfg.tls_cert_file,
        "ssl_keyfile": cfg.tls_key_file,
        "ssl_check_hostname": cfg.tls_verify_hostname,
        "ssl_cert_reqs": "required",
    }
