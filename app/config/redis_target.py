"""Where the shared-state Redis is: one of the shapes operators run, read from the
`redis` section. Pure (no client here: `app/state/link.py` builds one from a
`RedisTarget`), so a bad URL is a configuration error at start, exit code 2.

    redis://[user:password@]host[:port][/db]            one server
    rediss://...                                         the same over TLS (redis.tls_*)
    unix://[user:password@]/path/redis.sock[?db=N]       a unix socket
    redis+sentinel://[user:password@]h1:26379,h2:26379/service[/db]
                                                         Sentinel: the master of `service`
    redis+cluster://[user:password@]h1:6379,h2:6379     Redis Cluster (any seed nodes)
    rediss+sentinel://, rediss+cluster://                either over TLS

Sentinel and Cluster may also be given as fields (`redis.sentinels` with
`redis.sentinel_service`; `redis.cluster = true` with a redis:// or rediss:// URL).
Credentials in a URL are those of the Redis servers; `redis.password` wins over them
(a secret kept out of the URL), `redis.sentinel_password` is the Sentinels' own.
Nothing here ever puts a password in a message: `where()` is what logs may show.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

Shape = Literal["standalone", "sentinel", "cluster"]
Host = tuple[str, int]
SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
_PORTS = {"standalone": 6379, "sentinel": 26379, "cluster": 6379}


class TargetError(ValueError):
    """A `redis` section that names no Redis one can connect to (message has no secret)."""


@dataclass(frozen=True)
class RedisTarget:
    shape: Shape
    tls: bool = False
    hosts: tuple[Host, ...] = ()  # the server; the Sentinels; the cluster's seed nodes
    unix_path: str | None = None
    service: str | None = None  # Sentinel: the monitored master's name
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def where(self) -> str:
        """For logs and `/admin/status`: the shape and the addresses, never a credential."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        tls = " over TLS" if self.tls else ""
        if self.shape == "sentinel":
            return f"sentinel master {self.service!r} via {hosts}{tls} (db {self.db})"
        if self.shape == "cluster":
            return f"cluster via {hosts}{tls}"
        if self.unix_path is not None:
            return f"unix socket {self.unix_path} (db {self.db})"
        return f"{hosts}{tls} (db {self.db})"


def parse_target(
    url: str | None,
    *,
    sentinels: list[str] | tuple[str, ...] = (),
    sentinel_service: str | None = None,
    cluster: bool = False,
    password: str | None = None,
) -> RedisTarget | None:
    """The configured Redis, or None when none is (limits stay in-process)."""
    if url is None and not sentinels:
        if cluster or sentinel_service:
            raise TargetError(
                "redis.cluster / redis.sentinel_service need redis.url or redis.sentinels"
            )
        return None
    if sentinels:
        return _sentinel_fields(url, list(sentinels), sentinel_service, cluster, password)
    assert url is not None
    target = _from_url(url, sentinel_service)
    if cluster:
        if target.shape == "sentinel" or target.unix_path is not None:
            raise TargetError("redis.cluster = true needs a redis:// or rediss:// URL")
        target = _as_cluster(target)
    if password is not None:
        target = replace(target, password=password)
    return target


def _sentinel_fields(
    url: str | None, sentinels: list[str], service: str | None, cluster: bool, password: str | None
) -> RedisTarget:
    if url is not None:
        raise TargetError(
            "set either redis.url or redis.sentinels (with redis.sentinel_service), not both"
        )
    if cluster:
        raise TargetError("redis.sentinels and redis.cluster exclude each other")
    if not service:
        raise TargetError("redis.sentinels needs redis.sentinel_service (the master's name)")
    hosts = tuple(_host(item, 26379) for item in sentinels)
    return RedisTarget("sentinel", hosts=hosts, service=service, password=password)


def _from_url(url: str, service_field: str | None) -> RedisTarget:
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        shown = scheme if sep and len(scheme) < 20 else "?"
        raise TargetError(
            f"redis.url: unknown scheme {shown!r}; use one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise TargetError("redis.url is not a valid URL") from None
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if scheme == "unix":
        return _unix(parts.path, parts.query, username, password)
    tls = scheme.startswith("rediss")
    shape: Shape = (
        "sentinel"
        if scheme.endswith("+sentinel")
        else "cluster"
        if scheme.endswith("+cluster")
        else "standalone"
    )
    netloc = parts.netloc.rpartition("@")[2]
    if not netloc:
        raise TargetError("redis.url names no host")
    hosts = tuple(_host(item, _PORTS[shape]) for item in netloc.split(","))
    segments = [s for s in parts.path.split("/") if s]
    if shape == "standalone" and len(hosts) > 1:
        raise TargetError(
            "redis.url lists several hosts: use redis+sentinel:// or redis+cluster://"
        )
    service = None
    if shape == "sentinel":
        if segments:
            service = unquote(segments.pop(0))
        service = service or service_field
        if not service:
            raise TargetError("redis+sentinel:// needs the master's name: .../service[/db]")
    db = _db(segments, parse_qs(parts.query).get("db"))
    if shape == "cluster" and db != 0:
        raise TargetError("Redis Cluster has database 0 only: drop the /db from redis.url")
    return RedisTarget(shape, tls, hosts, None, service, db, username, password)


def _unix(path: str, query: str, username: str | None, password: str | None) -> RedisTarget:
    if not path:
        raise TargetError("unix:// needs the socket's path: unix:///path/to/redis.sock")
    db = _db([], parse_qs(query).get("db"))
    return RedisTarget("standalone", unix_path=path, db=db, username=username, password=password)


def _db(segments: list[str], query: list[str] | None) -> int:
    raw = segments[0] if segments else (query[0] if query else "0")
    if len(segments) > 1 or not raw.isdigit():
        raise TargetError("redis.url: the database must be a number, as in .../0")
    return int(raw)


def _host(item: str, default_port: int) -> Host:
    text = item.strip()
    if text.startswith("["):  # [::1]:6379
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not host:
        raise TargetError(f"redis: {item!r} is not host[:port]")
    if port and not port.isdigit():
        raise TargetError(f"redis: {item!r} is not host[:port]")
    number = int(port) if port else default_port
    if not 0 < number < 65536:
        raise TargetError(f"redis: port out of range in {item!r}")
    return host, number


def _as_cluster(target: RedisTarget) -> RedisTarget:
    if target.db != 0:
        raise TargetError("Redis Cluster has database 0 only: drop the /db from redis.url")
    return replace(target, shape="cluster")
