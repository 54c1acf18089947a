"""A small log-binned histogram: bounded memory, O(1) insert, quantiles within ~9 %.

Durations from 1 ms to about 5 minutes fall into bins four to an octave (each bin
spans a factor of 2^(1/4) = 1.19), so a quantile read from the geometric middle of
its bin is off by at most 9 %: plenty for a chart, and the memory of a histogram is at
most `BINS` counters however many samples it took. Below 1 ms is one bin, read as 0;
beyond the last bin, samples count in the last one.
"""

from __future__ import annotations

import math

FLOOR = 0.001  # seconds: the lower edge of the first timed bin
PER_OCTAVE = 4
BINS = 1 + PER_OCTAVE * 19  # 1 ms .. 2^19 ms (about 8.7 minutes)


def bin_of(seconds: float) -> int:
    if seconds < FLOOR:
        return 0
    return min(BINS - 1, 1 + int(math.log2(seconds / FLOOR) * PER_OCTAVE))


def value_of(index: int) -> float:
    """The geometric middle of a bin, in seconds (0 for the sub-millisecond bin)."""
    if index == 0:
        return 0.0
    return FLOOR * 2 ** ((index - 0.5) / PER_OCTAVE)


class Histogram:
    """Counts per bin, kept sparse: most windows see a handful of distinct bins."""

    __slots__ = ("bins", "count")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0

    def add(self, seconds: float) -> None:
        i = bin_of(seconds)
        self.bins[i] = self.bins.get(i, 0) + 1
        self.count += 1

    def clear(self) -> None:
        self.bins.clear()
        self.count = 0

    def merge(self, other: Histogram) -> None:
        for i, n in other.bins.items():
            self.bins[i] = self.bins.get(i, 0) + n
        self.count += other.count

    def quantile(self, q: float) -> float | None:
        """The value under which a share `q` of the samples fall (None: no sample)."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i in sorted(self.bins):
            seen += self.bins[i]
            if seen >= rank:
                return value_of(i)
        return value_of(max(self.bins))  # pragma: no cover - rank <= count always stops above
