"""`pace.lua` (the pacer replicas share through Redis) against the same cases as
`PaceState`: every case of tests/unit/limits/test_pace.py that takes `make` runs here
again, unchanged, on a real redis-server with the clock given to the script."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib

from app.limits.constants import HEADROOM
from app.limits.pacing import RateHeaders
from app.limits.shared_pace import PACE_SCRIPT
from tests.support.procs import redis_server
from tests.unit.limits import test_pace as cases

# The cases, collected here too; this module's `make` hands them the Lua pacer.
for _name, _case in vars(cases).items():
    if _name.startswith("test_") and "make" in inspect.signature(_case).parameters:
        globals()[_name] = _case


class LuaPace:
    def __init__(
        self,
        client: Any,
        rpm: float | None,
        tpm: float | None,
        window: float,
        key: str | None = None,
    ) -> None:
        self.script = client.register_script(PACE_SCRIPT.source())
        self.key = key or f"test:pace:{uuid.uuid4().hex}"  # a fresh state per pacer
        self.ceilings = [-1 if q is None else q / 60 * HEADROOM for q in (rpm, tpm)]
        self.window = window

    def _call(self, op: str, now: float, *extra: Any) -> list[Any]:
        args = [op, *self.ceilings, self.window, repr(now), *extra]
        return list(self.script(keys=[self.key], args=args))

    def reserve(self, now: float, requests: int = 1, tokens: int = 0) -> float:
        return int(self._call("reserve", now, requests, tokens)[0]) / 1000

    def throttled(self, now: float, wait: float | None, sent_at: float, accepted: float) -> bool:
        wait_ms = -1 if wait is None else round(wait * 1000)
        ago = round((now - sent_at) * 1000)
        return bool(int(self._call("throttled", now, wait_ms, ago, accepted)[0]))

    def observe(self, now: float, headers: RateHeaders) -> None:
        exhausted = headers.exhausted_for
        self._call(
            "observe",
            now,
            headers.limit_requests or -1,
            headers.limit_tokens or -1,
            -1 if exhausted is None else round(exhausted * 1000),
        )

    def rate(self, now: float) -> float | None:
        value = float(self._call("state", now)[2])
        return None if value < 0 else value

    def cooling(self, now: float) -> float:
        return int(self._call("state", now)[1]) / 1000


@pytest.fixture(scope="module")
def _redis_client() -> Iterator[Any]:
    with redis_server() as server:
        client = redis_lib.Redis(port=server.port, decode_responses=True)
        yield client
        client.close()


@pytest.fixture
def make(_redis_client: Any) -> Any:
    return lambda rpm, tpm, window: LuaPace(_redis_client, rpm, tpm, window)


# -- what only the shared pacer does ---------------------------------------------------------
def test_a_throttle_aims_under_what_all_replicas_got(_redis_client: Any) -> None:
    key = f"test:pace:{uuid.uuid4().hex}"
    one, two = (LuaPace(_redis_client, None, None, 1.0, key) for _ in range(2))
    # Each replica got 5 answers a second and reports them once a second (sync).
    one._call("state", 1000.2, 5)
    two._call("state", 1000.6, 5)
    # One replica's 429: its own measure says 5/s, the upstream really took 10/s.
    assert one.throttled(1001.3, 0.2, 1001.2, accepted=5.0)
    assert two.rate(1001.5) == pytest.approx(0.9 * 10.0, rel=1e-3)  # not 0.9 x 5


def test_reports_older_than_a_second_are_not_counted(_redis_client: Any) -> None:
    pace = LuaPace(_redis_client, None, None, 1.0)
    pace._call("state", 1000.2, 50)
    assert pace.throttled(1005.0, 0.2, 1004.9, accepted=5.0)
    assert pace.rate(1005.2) == pytest.approx(0.9 * 5.0, rel=1e-3)


def test_bookings_sent_together_wait_as_if_sent_one_by_one(_redis_client: Any) -> None:
    """The store sends a domain's bookings that meet in one round trip as one call: each
    gets the wait it would have got alone, in order."""
    now = 1000.0
    one_by_one = LuaPace(_redis_client, 600, 60000, 1.0)
    waits = [one_by_one.reserve(now, 1, t) for t in (100, 0, 2000, 1)]
    together = LuaPace(_redis_client, 600, 60000, 1.0)
    raw = together._call("reserve", now, 1, 100, 1, 0, 1, 2000, 1, 1)
    assert [int(w) / 1000 for w in str(raw[0]).split(",")] == waits
    assert waits[0] == 0 and waits[-1] > 0  # the case paces something
