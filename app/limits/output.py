"""What a request reserves for its answer at admission (`rate_limit.reserve_output`).

`max_tokens` is a ceiling a client sets once, not a forecast: coding agents send the
model's maximum on every turn (Claude Code 32,000 to 128,000) and answer in a few
hundred tokens. Reserving the ceiling turns a tokens-per-minute limit into a
concurrency limit of `limit / max_tokens`, and refuses outright any key whose minute is
smaller than one ceiling. So in `estimate` mode a request reserves, per choice,

    min(max_tokens, p-th percentile of the key's last `SAMPLES` completions of that model)

(`output_percentile`, default the 95th), and `default_max_tokens` (capped by
`max_tokens`) until `MIN_SAMPLES` completions are known. The reservation is settled to
the real usage when the answer ends, as always: an answer longer than its estimate is
charged in full and the bucket carries the difference as debt, so over any minute the
key still gets what its limit says; only the instant of the charge moves.

Each process keeps its own samples (a per-key, per-model ring, at most `MAX_SERIES`
series, the least recently used dropped first): estimates need no sharing, and an
estimate a replica has not learned yet falls back to the cautious default.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from dataclasses import dataclass, field

SAMPLES = 100
MIN_SAMPLES = 5
MAX_SERIES = 10_000


@dataclass
class _Series:
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    # The same samples in order, kept so as each one comes and goes (two binary searches
    # and a shift): every admission reads a percentile and every answer adds a sample, so
    # sorting them afresh per request was the estimate's whole cost.
    ordered: list[int] = field(default_factory=list)


class OutputEstimator:
    def __init__(self, percentile: float = 0.95) -> None:
        self.percentile = percentile
        self._series: OrderedDict[tuple[str, str], _Series] = OrderedDict()

    def reserve(self, key: str, model: str, max_tokens: int | None, default: int) -> int:
        """Output tokens to reserve for one choice of a request."""
        estimate = self.estimate(key, model)
        if estimate is None:
            estimate = default
        return estimate if max_tokens is None else min(max_tokens, estimate)

    def estimate(self, key: str, model: str) -> int | None:
        """The percentile of the key's recent completions, None while too few are known."""
        series = self._series.get((key, model))
        if series is None:
            return None
        ordered = series.ordered
        n = len(ordered)
        if n < MIN_SAMPLES:
            return None
        return ordered[max(0, math.ceil(self.percentile * n) - 1)]

    def observe(self, key: str, model: str, completion: int) -> None:
        """One answered request's completion tokens per choice."""
        index = (key, model)
        series = self._series.get(index)
        if series is None:
            series = self._series[index] = _Series()
            if len(self._series) > MAX_SERIES:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(index)
        value = max(0, completion)
        recent, ordered = series.recent, series.ordered
        if len(recent) == SAMPLES:  # the append below drops the oldest
            del ordered[bisect_left(ordered, recent[0])]
        recent.append(value)
        insort(ordered, value)
