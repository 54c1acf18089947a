"""Every Redis shape operators configure, read from the `redis` section, and the errors
a wrong one gets (exit code 2 at start, never a password in the message)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config.problems import ConfigError
from app.config.redis_target import RedisTarget
from app.config.schema import RedisConfig
from app.config.sources import ConfigFiles, load_settings


def target(**fields: object) -> RedisTarget | None:
    return RedisConfig(**fields).target()


@pytest.mark.parametrize(
    ("url", "shape", "tls", "hosts", "db", "where"),
    [
        ("redis://10.0.0.5/3", "standalone", False, [("10.0.0.5", 6379)], 3,
         "10.0.0.5:6379 (db 3)"),
        ("rediss://cache.internal:6380", "standalone", True, [("cache.internal", 6380)], 0,
         "cache.internal:6380 over TLS (db 0)"),
        ("redis://[::1]:7000/0", "standalone", False, [("::1", 7000)], 0, "::1:7000 (db 0)"),
        ("redis+sentinel://s1:26379,s2,s3:26380/mymaster/2", "sentinel", False,
         [("s1", 26379), ("s2", 26379), ("s3", 26380)], 2,
         "sentinel master 'mymaster' via s1:26379,s2:26379,s3:26380 (db 2)"),
        ("redis+cluster://n1:7000,n2:7001", "cluster", False, [("n1", 7000), ("n2", 7001)], 0,
         "cluster via n1:7000,n2:7001"),
        ("rediss+cluster://n1", "cluster", True, [("n1", 6379)], 0, "cluster via n1:6379 over TLS"),
    ],
)  # fmt: skip
def test_urls_of_each_shape(
    url: str, shape: str, tls: bool, hosts: list[tuple[str, int]], db: int, where: str
) -> None:
    t = target(url=url)
    assert t is not None
    assert (t.shape, t.tls, list(t.hosts), t.db, t.where()) == (shape, tls, hosts, db, where)


def test_unix_socket_with_its_database() -> None:
    t = target(url="unix:///run/redis/redis.sock?db=4")
    assert t is not None and (t.unix_path, t.db) == ("/run/redis/redis.sock", 4)
    assert t.where() == "unix socket /run/redis/redis.sock (db 4)"


def test_sentinel_and_cluster_as_fields() -> None:
    t = target(sentinels=["s1:26379", "s2"], sentinel_service="main", password="pw")
    assert t is not None and t.shape == "sentinel" and t.service == "main"
    assert t.hosts == (("s1", 26379), ("s2", 26379)) and t.password == "pw"
    c = target(url="rediss://seed:7000", cluster=True)
    assert c is not None and c.shape == "cluster" and c.tls and c.hosts == (("seed", 7000),)


def test_the_password_field_wins_over_the_urls_and_never_shows() -> None:
    t = target(url="redis://user:in-url@h:1/0", password="from-secret")
    assert t is not None and (t.username, t.password) == ("user", "from-secret")
    assert "from-secret" not in repr(t) and "from-secret" not in t.where()
    assert target(url="redis://:p%40ss@h/0").password == "p@ss"  # type: ignore[union-attr]


def test_nothing_configured_is_in_process() -> None:
    assert target() is None and not RedisConfig().enabled
    assert RedisConfig(sentinels=["s:1"], sentinel_service="m").enabled


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "http://h:1"}, "unknown scheme 'http'"),
        ({"url": "redis://a,b"}, "several hosts"),
        ({"url": "redis+sentinel://s1,s2"}, "needs the master's name"),
        ({"url": "redis+cluster://n1/2"}, "database 0 only"),
        ({"url": "redis://h/x"}, "database must be a number"),
        ({"url": "redis://h:99999"}, "port out of range"),
        ({"sentinels": ["s:1"]}, "needs redis.sentinel_service"),
        ({"url": "redis://h", "sentinels": ["s:1"], "sentinel_service": "m"}, "not both"),
        ({"cluster": True}, "need redis.url"),
        ({"url": "unix:///s.sock", "cluster": True}, "redis:// or rediss://"),
        ({"url": "redis://h", "tls_ca_file": "/ca.pem"}, "use a rediss:// URL"),
        ({"url": "rediss://h", "tls_cert_file": "/c.pem"}, "go together"),
        ({"key_prefix": "tg:{x}:"}, "should match pattern"),
    ],
)
def test_what_is_refused_and_why(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisConfig(**fields)


def test_a_bad_url_stops_the_start_without_showing_its_password(tmp_path: Path) -> None:
    c, s = tmp_path / "config.toml", tmp_path / "settings.json"
    c.write_text("")
    s.write_text(json.dumps({"redis": {"url": "redis+sentinel://:hunter2-secret@s1,s2"}}))
    with pytest.raises(ConfigError) as err:
        load_settings(ConfigFiles(c, s))
    text = err.value.render()
    assert "needs the master's name" in text and "hunter2-secret" not in text
