"""A domain's queue: strict priority between classes, deficit round robin within one.

    high ──► normal ──► low          a class is served only when every higher one is empty
      │
      └─ per-key FIFO lanes, served by DRR on estimated tokens: each visit adds
         `quantum` to a lane's deficit, the lane sends while its head fits, then the
         next lane's turn comes. A key flooding the queue only lengthens its own lane.

Removal is lazy: a job that gave up is flagged `cancelled`, leaves the count at once
and is skipped when reached. Pure and synchronous; the dispatcher owns concurrency.
"""

from __future__ import annotations

from collections import deque

from app.dispatch.job import Job
from app.runtime import PRIORITIES

QUANTUM = 4096
MAX_COST = 16 * QUANTUM  # one huge request costs at most this many rounds of others' turns


class _ClassLanes:
    def __init__(self, quantum: int) -> None:
        self.quantum = quantum
        self.lanes: dict[str, deque[Job]] = {}
        self.order: deque[str] = deque()
        self.deficit: dict[str, int] = {}
        self.in_turn = False

    def push(self, job: Job) -> None:
        lane = self.lanes.get(job.key)
        if lane is None:
            lane = self.lanes[job.key] = deque()
            self.order.append(job.key)
            self.deficit[job.key] = 0
        lane.append(job)

    def pop(self) -> Job | None:
        while self.order:
            key = self.order[0]
            lane = self.lanes[key]
            while lane and lane[0].cancelled:
                lane.popleft()
            if not lane:
                self._drop(key)
                continue
            if not self.in_turn:
                self.deficit[key] += self.quantum
                self.in_turn = True
            head = lane[0]
            cost = min(max(head.cost, 1), MAX_COST)
            if self.deficit[key] >= cost:
                self.deficit[key] -= cost
                lane.popleft()
                if not lane:
                    self._drop(key)
                return head
            self.order.rotate(-1)
            self.in_turn = False
        return None

    def _drop(self, key: str) -> None:
        del self.lanes[key]
        del self.deficit[key]
        self.order.popleft()
        self.in_turn = False


class DomainQueue:
    def __init__(self, capacity: int, quantum: int = QUANTUM) -> None:
        self.capacity = capacity
        self._classes = {p: _ClassLanes(quantum) for p in PRIORITIES}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, job: Job) -> bool:
        if self._size >= self.capacity:
            return False
        self._classes[job.priority].push(job)
        job.in_queue = True
        self._size += 1
        return True

    def pop(self) -> Job | None:
        for priority in PRIORITIES:
            job = self._classes[priority].pop()
            if job is not None:
                job.in_queue = False
                self._size -= 1
                return job
        return None

    def cancel(self, job: Job) -> None:
        """Forget a queued job (its client left or its wait expired)."""
        job.cancelled = True
        if job.in_queue:
            job.in_queue = False
            self._size -= 1

    def depth_by_priority(self) -> dict[str, int]:
        return {
            p: sum(1 for lane in c.lanes.values() for j in lane if not j.cancelled)
            for p, c in self._classes.items()
        }
