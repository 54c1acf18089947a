"""What a failure from Redis or its client means for the store (`app.state.link.classify`)."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from app.config.schema import RedisConfig
from app.limits.shared_store import BUCKET
from app.state.link import Call, ClusterAsServerError, RedisFault, classify, connect


@pytest.mark.parametrize(
    ("exc", "meaning"),
    [
        (rx.MovedError("3999 127.0.0.1:7001"), RedisFault.CONFIG),
        (rx.AskError("3999 127.0.0.1:7001"), RedisFault.CONFIG),
        (rx.ClusterCrossSlotError(), RedisFault.CONFIG),
        (rx.RedisClusterException("EVALSHA - all keys must map to the same key slot"),
         RedisFault.CONFIG),
        (ClusterAsServerError("cluster_enabled:1"), RedisFault.CONFIG),
        (rx.TimeoutError("Timeout reading from socket"), RedisFault.SLOW),
        (TimeoutError(), RedisFault.SLOW),
        (rx.ConnectionError("Error 111 connecting"), RedisFault.DOWN),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), RedisFault.DOWN),
        (rx.AuthenticationError("invalid username-password pair"), RedisFault.DOWN),
        (rx.ReadOnlyError("You can't write against a read only replica."), RedisFault.DOWN),
        (rx.ClusterDownError("The cluster is down"), RedisFault.DOWN),
        (ConnectionResetError(), RedisFault.DOWN),
        (AttributeError("'NoneType' object has no attribute 'write'"), RedisFault.BUG),
        (rx.ResponseError("ERR Error running script"), RedisFault.BUG),
    ],
)  # fmt: skip
def test_what_a_failure_means(exc: BaseException, meaning: RedisFault) -> None:
    assert classify(exc) is meaning


def test_a_script_call_is_evalsha_with_its_keys_then_its_arguments() -> None:
    link = connect(RedisConfig(url="redis://127.0.0.1:1/0"))
    call = Call(BUCKET, ("a{k}", "b{k}"), (10, 20, 0, 0, 5))
    sha = link.shas[BUCKET]
    assert call.command(link.shas) == ("EVALSHA", sha, 2, "a{k}", "b{k}", 10, 20, 0, 0, 5)
    assert Call(None, (), ("HGETALL", "x")).command(link.shas) == ("HGETALL", "x")
