"""Tally cells: the hot path's records, handed to prometheus_client when it is read.

The instruments every request touches are recorded in plain `Tally` cells and handed
to their prometheus_client children when the registry is collected (a scrape, or
anything reading the registry: `Fold` is its first collector), not per call:
prometheus_client takes a lock and checks the child on every increment, and a histogram
walks its buckets, which was about a sixth of the gateway's own instructions per request
(deploy/BENCHMARKS.md). With `--workers N` the values live in shared files that other
workers' scrapes read, so there each record is handed over at once (write-through). The
cells are the event loop's: the verbs and the scrape run on its thread.

A cell reads a child's own bucket bounds and values (`_upper_bounds`, `_buckets`,
`_sum`): tests/unit/test_metrics.py checks the result against prometheus_client's own
counting, so a change of those internals fails there, not in production.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any


class Tally:
    """A counter's or a histogram's records not yet handed to its prometheus_client child.

    A histogram's observation is counted in the bucket prometheus_client would count it
    in (the first upper bound >= the value: `bisect_left` over the child's own bounds),
    and folded in with the child's bucket and sum values, the ones `observe` adds to."""

    __slots__ = ("bounds", "buckets", "child", "counts", "total", "write_through")

    def __init__(self, child: Any, write_through: bool) -> None:
        self.child = child
        self.write_through = write_through
        self.total = 0.0  # a counter's increments, a histogram's sum
        # A histogram's bounds (+Inf last) and per-bucket counts; None for a counter.
        self.bounds: list[float] | None = getattr(child, "_upper_bounds", None)
        self.buckets: list[Any] = getattr(child, "_buckets", [])
        self.counts = [0] * len(self.buckets)

    def inc(self, amount: float = 1.0) -> None:
        self.total += amount
        if self.write_through:
            self.fold()

    def observe(self, value: float) -> None:
        assert self.bounds is not None
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        if self.write_through:
            self.fold()

    def fold(self) -> None:
        if self.bounds is None:
            if self.total:
                self.child.inc(self.total)
                self.total = 0.0
            return
        counts = self.counts
        for i, n in enumerate(counts):
            if n:
                self.buckets[i].inc(n)
                counts[i] = 0
        self.child._sum.inc(self.total)
        self.total = 0.0


class Fold:
    """Registered first on the registry: collecting it hands every tally to its child, so
    the instruments collected after it are exact. It exposes nothing itself."""

    def __init__(self, fold: Callable[[], None]) -> None:
        self.fold = fold

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        self.fold()
        return iter(())
