"""The last minutes of traffic, in a fixed ring of time buckets, for the status page.

    record (hot path)                       read (the page, every few seconds)
      epoch = now // step                     the `points` complete buckets before
      bucket = ring[epoch % points]           the current one, oldest first; a bucket
      bucket.epoch != epoch -> reset it       whose epoch is stale reads as empty
      add to its counters / histograms

A record costs one clock read, an index and a few additions; nothing is allocated
after the first use of a bucket and nothing ever walks the ring on the hot path, so
memory is fixed (`points` buckets, each at most two `Histogram`s of bounded size) and
an idle hour costs nothing. Prometheus keeps the long history; this is what an
operator sees without installing anything.

The clock is injected (monotonic by default) and is the only notion of time here;
`wall` only labels the series for the page.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.status.histogram import Histogram

Clock = Callable[[], float]
STATUS_CLASSES = ("2xx", "4xx", "429", "5xx")


def status_class(status: int) -> int:
    """Index into `STATUS_CLASSES`: 429 apart (rate limits), other 4xx, 5xx, the rest ok."""
    if status == 429:
        return 2
    if status < 400:
        return 0
    return 1 if status < 500 else 3


class _Bucket:
    __slots__ = ("completion", "epoch", "prompt", "statuses", "throttled", "ttft", "wait")

    def __init__(self) -> None:
        self.epoch = -1
        self.statuses = [0, 0, 0, 0]
        self.prompt = 0
        self.completion = 0
        self.throttled = 0
        self.ttft = Histogram()
        self.wait = Histogram()

    def reset(self, epoch: int) -> None:
        self.epoch = epoch
        self.statuses[:] = (0, 0, 0, 0)
        self.prompt = self.completion = self.throttled = 0
        self.ttft.clear()
        self.wait.clear()


class Ring:
    def __init__(
        self,
        step_sec: float = 5.0,
        span_sec: float = 900.0,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.step = step_sec
        self.points = max(1, round(span_sec / step_sec))
        self.clock = clock
        self.wall = wall
        # One bucket more than the points shown: the current one, still filling.
        self._buckets = [_Bucket() for _ in range(self.points + 1)]
        self._current = self._buckets[0]
        self._until = -1.0  # clock time the current bucket ends: before it, no arithmetic

    # -- recording (hot path) ------------------------------------------------------
    def _bucket(self) -> _Bucket:
        if self.clock() < self._until:
            return self._current
        return self._advance()

    def _advance(self) -> _Bucket:
        epoch = int(self.clock() // self.step)
        b = self._buckets[epoch % len(self._buckets)]
        if b.epoch != epoch:
            b.reset(epoch)
        self._current, self._until = b, (epoch + 1) * self.step
        return b

    def answered(self, status: int, prompt: int = 0, completion: int = 0) -> None:
        b = self._bucket()
        b.statuses[status_class(status)] += 1
        if prompt:
            b.prompt += prompt
        if completion:
            b.completion += completion

    def ttft(self, seconds: float) -> None:
        self._bucket().ttft.add(seconds)

    def queue_wait(self, seconds: float) -> None:
        self._bucket().wait.add(seconds)

    def throttled(self) -> None:
        self._bucket().throttled += 1

    # -- reading ----------------------------------------------------------------------
    def _window(self, now: float) -> tuple[list[_Bucket | None], _Bucket | None]:
        """The complete buckets, oldest first (None: nothing recorded then), and the
        current one."""
        current = int(now // self.step)
        size = len(self._buckets)

        def at(epoch: int) -> _Bucket | None:
            b = self._buckets[epoch % size]
            return b if b.epoch == epoch else None

        return [at(e) for e in range(current - self.points, current)], at(current)

    def series(self) -> dict[str, object]:
        """Per-second rates and per-bucket quantiles of the complete buckets (charts), and
        totals over the window including the current bucket (they move at once)."""
        now = self.clock()
        done, current = self._window(now)
        step = self.step

        def rate(values: list[float]) -> list[float]:
            return [round(v / step, 3) for v in values]

        def counts(get: Callable[[_Bucket], float]) -> list[float]:
            return [get(b) if b else 0 for b in done]

        def quantiles(hist: Callable[[_Bucket], Histogram], q: float) -> list[float | None]:
            return [_ms(hist(b).quantile(q)) if b else None for b in done]

        return {
            "step_sec": step,
            "points": self.points,
            # Wall time at the end of the last complete bucket: the charts' right edge.
            "end_unix": round(self.wall() - (now - (now // step) * step), 3),
            "requests_per_sec": {
                name: rate([b.statuses[i] if b else 0 for b in done])
                for i, name in enumerate(STATUS_CLASSES)
            },
            "tokens_per_sec": {
                "prompt": rate(counts(lambda b: b.prompt)),
                "completion": rate(counts(lambda b: b.completion)),
            },
            "upstream_429_per_sec": rate(counts(lambda b: b.throttled)),
            "ttft_ms": {
                "p50": quantiles(lambda b: b.ttft, 0.5),
                "p95": quantiles(lambda b: b.ttft, 0.95),
            },
            "queue_wait_ms": {"p95": quantiles(lambda b: b.wait, 0.95)},
            "totals": self._totals([*done, current]),
        }

    def recent_statuses(self, seconds: float) -> dict[str, int]:
        """Answers per status class over about the last `seconds` (current bucket included)."""
        done, current = self._window(self.clock())
        counts = [0, 0, 0, 0]
        for b in [*done[-max(1, round(seconds / self.step)) :], current]:
            if b is not None:
                for i, n in enumerate(b.statuses):
                    counts[i] += n
        return dict(zip(STATUS_CLASSES, counts, strict=True))

    def _totals(self, buckets: list[_Bucket | None]) -> dict[str, object]:
        statuses = [0, 0, 0, 0]
        prompt = completion = throttled = 0
        ttft, wait = Histogram(), Histogram()
        for b in buckets:
            if b is None:
                continue
            for i, n in enumerate(b.statuses):
                statuses[i] += n
            prompt += b.prompt
            completion += b.completion
            throttled += b.throttled
            ttft.merge(b.ttft)
            wait.merge(b.wait)
        return {
            "window_sec": round(self.points * self.step),
            "requests": dict(zip(STATUS_CLASSES, statuses, strict=True)),
            "tokens": {"prompt": prompt, "completion": completion},
            "upstream_429": throttled,
            "ttft_ms": {"p50": _ms(ttft.quantile(0.5)), "p95": _ms(ttft.quantile(0.95))},
            "queue_wait_ms": {"p95": _ms(wait.quantile(0.95))},
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
