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

A request the upstream refused with 429 comes back with `push_front`: to the head of
its key's lane, tagged at the virtual time (so it goes next within its class), and
its key is refunded the cost it was charged, so flow control costs it no fair share.

Removal is lazy: a job that gave up is flagged `cancelled`, leaves the count at once
and is skipped when reached. Pure and synchronous; the dispatcher owns concurrency.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count

from app.dispatch.job import Job
from app.kinds import INTERACTIVE, QueueClass

MAX_COST = 1 << 20  # one estimate can not push its key's next turn out by more than this


class _ClassLanes:
    def __init__(self) -> None:
        self.lanes: dict[str, deque[Job]] = {}
        self.finish: dict[str, float] = {}  # last finish tag per key
        self.heads: list[tuple[float, int, str]] = []  # (start tag, arrival, key)
        self.tagged: dict[str, int] = {}  # key -> arrival of its one valid entry in heads
        self.vtime = 0.0
        self._seq = count()
        self._front = count(-1, -1)  # requeued heads win ties

    def push(self, job: Job) -> None:
        lane = self.lanes.get(job.key)
        if lane is None:
            lane = self.lanes[job.key] = deque()
        lane.append(job)
        if len(lane) == 1:
            self._tag_head(job.key)

    def push_front(self, job: Job) -> None:
        key = job.key
        start = self.vtime
        if job.tag >= 0:  # it was served from this queue: refund what that charged
            self.finish[key] = max(0.0, self.finish.get(key, 0.0) - _charge(job))
            start = min(start, job.tag)
        lane = self.lanes.setdefault(key, deque())
        lane.appendleft(job)
        self._tag(key, start, next(self._front))

    def _tag_head(self, key: str) -> None:
        self._tag(key, max(self.vtime, self.finish.get(key, 0.0)), next(self._seq))

    def _tag(self, key: str, start: float, seq: int) -> None:
        self.tagged[key] = seq  # an older entry of this key is stale from now on
        heapq.heappush(self.heads, (start, seq, key))

    def pop(self) -> Job | None:
        while self.heads:
            start, seq, key = heapq.heappop(self.heads)
            if self.tagged.get(key) != seq:
                continue  # replaced by a requeued head
            lane = self.lanes[key]
            head = lane.popleft()
            if head.cancelled:
                self._after(key, lane)  # skipped: nothing charged
                continue
            self.vtime = start
            head.tag = start
            # max(): a requeued head goes at its old tag, after later jobs of its key were
            # charged; its charge comes on top of theirs, not instead of them.
            self.finish[key] = max(self.finish.get(key, 0.0), start) + _charge(head)
            self._after(key, lane)
            return head
        return None

    def _after(self, key: str, lane: deque[Job]) -> None:
        if lane:
            self._tag_head(key)
        else:
            del self.lanes[key]
            del self.tagged[key]
            if not self.heads:
                self.finish.clear()  # idle class: history no longer matters
                self.vtime = 0.0


def _charge(job: Job) -> float:
    return float(min(max(job.cost, 1), MAX_COST))


class DomainQueue:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._classes = {c: _ClassLanes() for c in QueueClass}
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
        self._batch += job.priority is QueueClass.BATCH
        return True

    def push_front(self, job: Job) -> None:
        """Put back a job the upstream refused with 429: next in its class, its key
        refunded, past the capacity (it was admitted already)."""
        self._classes[job.priority].push_front(job)
        job.in_queue = True
        self._size += 1
        self._batch += job.priority is QueueClass.BATCH

    def pop(self, *, allow_batch: bool = True) -> Job | None:
        for priority in QueueClass if allow_batch else INTERACTIVE:
            job = self._classes[priority].pop()
            if job is not None:
                job.in_queue = False
                self._size -= 1
                self._batch -= priority is QueueClass.BATCH
                return job
        return None

    def cancel(self, job: Job) -> None:
        """Forget a queued job (its client left or its wait expired)."""
        job.cancelled = True
        if job.in_queue:
            job.in_queue = False
            self._size -= 1
            self._batch -= job.priority is QueueClass.BATCH

    def interactive_waiting(self) -> bool:
        return self._size > self._batch

    def depth_by_priority(self) -> dict[str, int]:
        return {
            p: sum(1 for lane in c.lanes.values() for j in lane if not j.cancelled)
            for p, c in self._classes.items()
        }
