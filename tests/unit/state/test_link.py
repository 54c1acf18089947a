"""What a failure from Redis or its client means for the store (`redis_conn.classify`)."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from app.config.schema import RedisConfig
from app.limits.redis_conn import Call, ClusterAsServerError, Failure, classify, connect


@pytest.mark.parametrize(
    ("exc", "meaning"),
    [
        (rx.MovedError("3999 127.0.0.1:7001"), Failure.CONFIG),
        (rx.AskError("3999 127.0.0.1:7001"), Failure.CONFIG),
        (rx.ClusterCrossSlotError(), Failure.CONFIG),
        (rx.RedisClusterException("EVALSHA - all keys must map to the same key slot"),
         Failure.CONFIG),
        (ClusterAsServerError("cluster_enabled:1"), Failure.CONFIG),
        (rx.TimeoutError("Timeout reading from socket"), Failure.SLOW),
        (TimeoutError(), Failure.SLOW),
        (rx.ConnectionError("Error 111 connecting"), Failure.DOWN),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), Failure.DOWN),
        (rx.AuthenticationError("invalid username-password pair"), Failure.DOWN),
        (rx.ReadOnlyError("You can't write against a read only replica."), Failure.DOWN),
        (rx.ClusterDownError("The cluster is down"), Failure.DOWN),
        (ConnectionResetError(), Failure.DOWN),
        (AttributeError("'NoneType' object has no attribute 'write'"), Failure.BUG),
        (rx.ResponseError("ERR Error running script"), Failure.BUG),
    ],
)  # fmt: skip
def test_what_a_failure_means(exc: BaseException, meaning: Failure) -> None:
    assert classify(exc) is meaning


def test_a_script_call_is_evalsha_with_its_keys_then_its_arguments() -> None:
    link = connect(RedisConfig(url="redis://127.0.0.1:1/0"))
    call = Call("token_bucket.lua", ("a{k}", "b{k}"), (10, 20, 0, 0, 5))
    sha = link.shas["token_bucket.lua"]
    assert call.command(link.shas) == ("EVALSHA", sha, 2, "a{k}", "b{k}", 10, 20, 0, 0, 5)
    assert Call(None, (), ("HGETALL", "x")).command(link.shas) == ("HGETALL", "x")
