"""A domain's queue: strict priority between classes, fair queuing within one.

    high ──► normal ──► low ──► batch   a class is served only when every higher one is
                                        empty; `batch` (batch-API items) only when the
                                        dispatcher also has spare capacity for it
      │
      └─ per-key FIFO lanes, served by start-time fair queuing (SFQ) on estimated
         tokens: a lane's head is tagged `start = max(virtual time, the lane's last
         finish)`, `finish = start + cost`; the smallest start tag goes next and the
         virtual time advances to it. Equal keys alternate request by request, a key
         sending big requests gets proportionally fewer of them (fair in tokens, as
         deficit round robin is, at request granularity), and a key flooding the
         queue only lengthens its own lane.

Removal is lazy: a job that gave up is flagged `cancelled`, leaves the count at once
and is skipped when reached. Pure and synchronous; the dispatcher owns concurrency.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count

from app.dispatch.job import Job
from app.runtime import PRIORITIES

CLASSES = (*PRIORITIES, "batch")

MAX_COST = 1 << 20  # one estimate can not push its key's next turn out by more than this


class _ClassLanes:
    def __init__(self) -> None:
        self.lanes: dict[str, deque[Job]] = {}
        self.finish: dict[str, float] = {}  # last finish tag per key
        self.heads: list[tuple[float, int, str]] = []  # (start tag, arrival, key)
        self.vtime = 0.0
        self._seq = count()

    def push(self, job: Job) -> None:
        lane = self.lanes.get(job.key)
        if lane is None:
            lane = self.lanes[job.key] = deque()
        lane.append(job)
        if len(lane) == 1:
            self._tag_head(job.key)

    def _tag_head(self, key: str) -> None:
        start = max(self.vtime, self.finish.get(key, 0.0))
        heapq.heappush(self.heads, (start, next(self._seq), key))

    def pop(self) -> Job | None:
        while self.heads:
            start, _, key = heapq.heappop(self.heads)
            lane = self.lanes[key]
            head = lane.popleft()
            if head.cancelled:
                self._after(key, lane)  # skipped: nothing charged
                continue
            self.vtime = start
            self.finish[key] = start + min(max(head.cost, 1), MAX_COST)
            self._after(key, lane)
            return head
        return None

    def _after(self, key: str, lane: deque[Job]) -> None:
        if lane:
            self._tag_head(key)
        else:
            del self.lanes[key]
            if not self.heads:
                self.finish.clear()  # idle class: history no longer matters
                self.vtime = 0.0


class DomainQueue:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._classes = {p: _ClassLanes() for p in CLASSES}
        self._size = 0
        self._batch = 0  # of _size, jobs of the batch class

    def __len__(self) -> int:
        return self._size

    def push(self, job: Job, slack: int = 0) -> bool:
        """Queue `job` unless full; `slack` counts dispatch slots that are free right now
        (the dispatcher will move that many out at its next turn), so a burst is admitted
        up to exactly max_inflight + capacity, whenever the dispatcher gets to run."""
        if self._size >= self.capacity + max(0, slack):
            return False
        self._classes[job.priority].push(job)
        job.in_queue = True
        self._size += 1
        self._batch += job.priority == "batch"
        return True

    def pop(self, *, allow_batch: bool = True) -> Job | None:
        for priority in CLASSES if allow_batch else PRIORITIES:
            job = self._classes[priority].pop()
            if job is not None:
                job.in_queue = False
                self._size -= 1
                self._batch -= priority == "batch"
                return job
        return None

    def cancel(self, job: Job) -> None:
        """Forget a queued job (its client left or its wait expired)."""
        job.cancelled = True
        if job.in_queue:
            job.in_queue = False
            self._size -= 1
            self._batch -= job.priority == "batch"

    def interactive_waiting(self) -> bool:
        return self._size > self._batch

    def depth_by_priority(self) -> dict[str, int]:
        return {
            p: sum(1 for lane in c.lanes.values() for j in lane if not j.cancelled)
            for p, c in self._classes.items()
        }
