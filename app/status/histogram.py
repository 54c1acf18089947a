"""A small log-binned histogram: bounded memory, O(1) insert, quantiles within ~9 %.

Durations from 1 ms to about 5 minutes fall into bins four to an octave (each bin
spans a factor of 2^(1/4) = 1.19), so a quantile read from the geometric middle of
its bin is off by at most 9 %: plenty for a chart, and the memory of a histogram is at
most `BINS` counters however many samples it took. Below 1 ms is one bin, read as 0;
beyond the last bin, samples count in the last one.
"""

from __future__ import annotations

import math
from bisect import bisect_right

FLOOR = 0.001  # seconds: the lower edge of the first timed bin
PER_OCTAVE = 4
BINS = 1 + PER_OCTAVE * 19  # 1 ms .. 2^19 ms (about 8.7 minutes)
# Lower edges of bins 1..BINS-1: a bisection (in C) is cheaper than a logarithm.
_EDGES = [FLOOR * 2 ** (i / PER_OCTAVE) for i in range(BINS - 1)]


def bin_of(seconds: float) -> int:
    return bisect_right(_EDGES, seconds)


def value_of(index: int) -> float:
    """The geometric middle of a bin, in seconds (0 for the sub-millisecond bin)."""
    if index == 0:
        return 0.0
    return FLOOR * 2 ** ((index - 0.5) / PER_OCTAVE)


class Histogram:
    """Counts per bin, kept sparse: most windows see a handful of distinct bins."""

    __slots__ = ("bins",)

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}

    def add(self, seconds: float) -> None:
        i = bisect_right(_EDGES, seconds)  # bin_of, inlined: this runs per request
        self.bins[i] = self.bins.get(i, 0) + 1

    @property
    def count(self) -> int:
        return sum(self.bins.values())

    def clear(self) -> None:
        self.bins.clear()

    def merge(self, other: Histogram) -> None:
        for i, n in other.bins.items():
            self.bins[i] = self.bins.get(i, 0) + n

    def quantile(self, q: float) -> float | None:
        """The value under which a share `q` of the samples fall (None: no sample)."""
        count = self.count
        if not count:
            return None
        rank = max(1, math.ceil(q * count))
        seen = 0
        for i in sorted(self.bins):
            seen += self.bins[i]
            if seen >= rank:
                return value_of(i)
        return value_of(max(self.bins))  # pragma: no cover - rank <= count always stops above
