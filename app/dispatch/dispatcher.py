"""Per-domain dispatcher: releases queued requests upstream in groups.

    request ──► acquire() ──nobody queued, a slot free, quota ready──► slot (at once)
                   │
                   └─else──► DomainQueue ──► _run(): up to group_size per dispatch
                                             group (config `batch_size`), waiting
                                             ≤ batch_window_ms to fill it,
                                             never past max_inflight, paced to the
                                             upstream quota ──► slot

Only requests that had to wait are grouped: a slot standing free is never held back
to fill a group (that would add latency and buy nothing, since every request is its
own upstream call).

The queue-depth and in-flight gauges are read from here when /metrics is scraped (and
every second for other workers' scrapes), not written on every change: that was a
measurable share of a request's CPU.

An upstream 429 is flow control, never a failure of the queue: the pipeline hands
the slot back with `requeue`, the request goes to the head of its class (its key
refunded, see queue.py) and waits out the domain's cool-down like everyone else.
Only `max_queue_wait_ms`, counted from its first arrival, ends that wait; if the
cool-down already outlasts it, the answer is 503 at once rather than a useless wait.

A slot is held until the answer ends (a stream holds it to its last byte) and its
release wakes the loop. The dispatcher never calls the upstream itself: it grants
slots, and each request makes its own call in its own (ASGI) task, so a client
disconnect cancels exactly its own work. The loop task is the only task created here,
started and stopped by the gateway's lifecycle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app.dispatch.drain import DrainEstimate
from app.dispatch.job import Job, QueueExpired
from app.dispatch.queue import DomainQueue
from app.errors import ServiceUnavailable
from app.kinds import QueueClass
from app.limits.pacing import Pacer
from app.metrics import Metrics


class Slot:
    """A grant to send one upstream request; remembers its request for a requeue."""

    __slots__ = (
        "_owner",
        "batch",
        "cost",
        "key",
        "priority",
        "released",
        "sent_at",
        "since",
        "tag",
    )

    def __init__(
        self,
        owner: Dispatcher,
        key: str,
        priority: QueueClass,
        cost: int,
        since: float,
        tag: float = -1.0,
    ) -> None:
        self._owner = owner
        self.key, self.priority, self.cost = key, priority, cost
        self.batch = priority is QueueClass.BATCH
        self.since = since  # first arrival at this domain: the queue deadline counts from it
        self.tag = tag
        self.sent_at = owner.clock()
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            owner = self._owner
            owner.drain.released(owner.clock() - self.sent_at)
            owner._release(self.batch)


class Dispatcher:
    def __init__(
        self,
        domain: str,
        *,
        group_size: int,
        group_window_ms: float,
        queue_capacity: int,
        max_queue_wait_ms: int,
        max_inflight: int,
        pacer: Pacer,
        metrics: Metrics,
        batch_share: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.domain = domain
        self.group_size = group_size
        self.window = group_window_ms / 1000
        self.max_wait = max_queue_wait_ms / 1000
        self.max_inflight = max_inflight
        self.queue = DomainQueue(queue_capacity)
        self.pacer = pacer
        self.metrics = metrics
        self.clock = clock
        self.inflight = 0
        self.batch_inflight = 0
        self.batch_share = batch_share
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.drain = DrainEstimate()

    def retune(
        self,
        *,
        group_size: int,
        group_window_ms: float,
        queue_capacity: int,
        max_queue_wait_ms: int,
        max_inflight: int,
        batch_share: float,
    ) -> None:
        """New settings from a reload, for the next decision. Requests already queued keep
        their place (a smaller capacity refuses newcomers until the queue is under it) and
        their deadline timer (a new max_queue_wait_ms applies to requests queued from now)."""
        self.group_size = group_size
        self.window = group_window_ms / 1000
        self.queue.capacity = queue_capacity
        self.max_wait = max_queue_wait_ms / 1000
        self.max_inflight = max_inflight
        self.batch_share = batch_share
        self._wake.set()  # more slots or a shorter window may release someone now

    def settings(self) -> dict[str, object]:
        """The settings in force (a reload changes them: `retune`), as configured."""
        return {
            "batch_size": self.group_size,
            "batch_window_ms": self.window * 1000,
            "queue_capacity": self.queue.capacity,
            "max_queue_wait_ms": round(self.max_wait * 1000),
            "max_inflight": self.max_inflight,
            "batch_share": self.batch_share,
        }

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"dispatch:{self.domain}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    @property
    def batch_cap(self) -> int:
        """Slots batch items may hold: interactive traffic keeps the rest."""
        return max(1, int(self.max_inflight * self.batch_share))

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and len(self.queue) == 0

    async def wait_idle(self) -> None:
        """Return once nothing is queued or in flight (graceful drain)."""
        while not self.idle:
            self._idle.clear()
            await self._idle.wait()

    # -- requests' side -----------------------------------------------------------------
    async def acquire(self, key: str, priority: QueueClass, cost: int, waited: float = 0.0) -> Slot:
        """A slot at once if one is free and nobody waits, else a place in the queue.
        `waited`: seconds the request already spent in another line (its key's
        `max_concurrent`, an earlier domain's queue); `max_queue_wait_ms` bounds all its
        waiting together, not each line on its own."""
        batch = priority is QueueClass.BATCH
        paced = self.pacer.bounded()
        if self._free_for(batch) and (not paced or self.pacer.ready(cost)):
            # Nobody is waiting and there is room: go at once. Holding a request for a
            # group while slots stand free would only add latency, and at modest
            # concurrency it cost throughput too (deploy/BENCHMARKS.md, "Figures behind
            # the design"); groups form from requests that had to wait anyway.
            self._take(batch)
            slot = Slot(self, key, priority, cost, self.clock())
            if paced:
                try:
                    await self._pace(1, cost)
                except BaseException:
                    self._release(batch)
                    raise
                slot.sent_at = self.clock()
            self.metrics.record_group(self.domain, 1)
            self.metrics.record_queue_wait(self.domain, 0.0)
            return slot
        return await self._wait_in_queue(Job(key, priority, cost, self.clock()), waited=waited)

    async def requeue(self, slot: Slot) -> Slot:
        """The upstream said 429: give the slot back and wait, at the head of the class,
        for the cool-down to end (or for max_queue_wait_ms since the first arrival)."""
        slot.release()
        deadline = slot.since + self.max_wait
        cooling = self.pacer.cooling()
        if self.clock() + cooling > deadline:
            raise ServiceUnavailable(
                f"domain {self.domain!r}'s upstream is rate limiting; its cool-down "
                f"({cooling:.1f} s) outlasts max_queue_wait_ms",
                code="upstream_rate_limited",
                retry_after=cooling,
                should_retry=True,
            )
        job = Job(slot.key, slot.priority, slot.cost, slot.since)
        job.tag = slot.tag
        return await self._wait_in_queue(job, front=True)

    async def _pace(self, requests: int, tokens: int) -> None:
        """Wait for the pacer's booking, then for any cool-down that began meanwhile."""
        wait = await self.pacer.reserve(requests, tokens)
        if wait > 0:
            await asyncio.sleep(wait)
        # A clock, not an event: another 429 (or another replica) may extend it meanwhile.
        while (cooling := self.pacer.cooling()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(cooling)

    def _free_for(self, batch: bool) -> bool:
        """No one queued, a slot free and, for batch work, its share not used up."""
        if len(self.queue) or self.inflight >= self.max_inflight:
            return False
        return not batch or self.batch_inflight < self.batch_cap

    async def _wait_in_queue(self, job: Job, front: bool = False, waited: float = 0.0) -> Slot:
        if front:
            self.queue.push_front(job)
        elif not self.queue.push(job, slack=self.max_inflight - self.inflight):
            self.metrics.record_queue_full(self.domain)
            raise ServiceUnavailable(
                f"domain {self.domain!r} queue is full ({self.queue.capacity} waiting); "
                "retry after the advertised delay",
                code="queue_full",
                retry_after=self.drain_estimate(),
                should_retry=True,
            )
        self._wake.set()
        # A timer that fails the job's own future, not `asyncio.wait_for` (which wraps the
        # wait in another future per request): a grant and an expiry can not both happen.
        pushed = self.clock()
        left = job.enqueued_at + self.max_wait - waited - pushed
        timer = job.granted.get_loop().call_later(max(0.0, left), job.expire)
        try:
            await job.granted
        except QueueExpired:
            self._forget(job)
            raise ServiceUnavailable(
                f"request waited longer than max_queue_wait_ms ({int(self.max_wait * 1000)} ms) "
                f"in domain {self.domain!r}'s queue",
                code="queue_timeout",
                retry_after=self.drain_estimate(),
                should_retry=True,
            ) from None
        except asyncio.CancelledError:
            self._forget(job)
            if _was_granted(job):
                self._release(job.priority is QueueClass.BATCH)
            raise
        finally:
            timer.cancel()
        self.metrics.record_queue_wait(self.domain, self.clock() - pushed)
        return Slot(self, job.key, job.priority, job.cost, job.enqueued_at, job.tag)

    def _forget(self, job: Job) -> None:
        self.queue.cancel(job)
        if self.idle:
            self._idle.set()

    def drain_estimate(self) -> float:
        """Seconds until the queue ahead of a newcomer drains, from the measured hold time
        of a slot, the slots and the pace (`drain.py`)."""
        return self.drain.seconds(
            len(self.queue) + 1, self.max_inflight, self.pacer.rate(), self.pacer.cooling()
        )

    def _take(self, batch: bool = False) -> None:
        self.inflight += 1
        self.batch_inflight += batch

    def _release(self, batch: bool = False) -> None:
        self.inflight -= 1
        self.batch_inflight -= batch
        if len(self.queue):
            self._wake.set()
        elif self.inflight == 0:
            self._idle.set()

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            if not self._can_release():
                self._wake.clear()
                await self._wake.wait()
                continue
            if (cooling := self.pacer.cooling()) > 0:
                await asyncio.sleep(cooling)  # the upstream said 429: nothing goes meanwhile
                continue
            if self.inflight > 0 and len(self.queue) < self.group_size and self.window > 0:
                await asyncio.sleep(self.window)  # the domain is busy: let the group fill
            released = await self._release_group()
            if released:
                self.metrics.record_group(self.domain, released)
            await asyncio.sleep(0)  # let the group's requests start before the next group

    def _can_release(self) -> bool:
        if not len(self.queue) or self.inflight >= self.max_inflight:
            return False
        return self.queue.interactive_waiting() or self.batch_inflight < self.batch_cap

    async def _release_group(self) -> int:
        if self.pacer.bounded():
            return await self._release_paced()
        released = 0
        while released < self.group_size and self._can_release():
            job = await self._grant_next(False)
            if job is None:
                break
            released += 1
        return released

    async def _release_paced(self) -> int:
        """Book the group's quota slots at once (a shared pacer sends the bookings that
        meet in one round trip together: one for the whole group), then release a job
        as each slot comes. The quota is waited for *before* a job is chosen: one picked
        first could expire while it waited, and fair queuing would have charged its key
        for nothing. A cool-down that begins meanwhile (a 429) drops the slots left: they
        are booked again after it, never spent in a burst at its end."""
        room = min(self.group_size, len(self.queue), self.max_inflight - self.inflight)
        booked = self.clock()
        waits = sorted(await asyncio.gather(*(self.pacer.reserve(1, 0) for _ in range(room))))
        released = 0
        for wait in waits:
            if (delay := booked + wait - self.clock()) > 0:
                await asyncio.sleep(delay)
            if self.pacer.cooling() > 0 or not self._can_release():
                break
            job = await self._grant_next(True)
            if job is None:
                break
            released += 1
        return released

    async def _grant_next(self, paced: bool) -> Job | None:
        """Grant the next waiting job, after booking its tokens; None if nobody waits or
        the pacing awaits let another request take the last slot (the job goes back)."""
        while (job := self._next_waiting()) is not None:
            if paced:
                await self._pace(0, job.cost)
            batch = job.priority is QueueClass.BATCH
            if self.inflight >= self.max_inflight or (
                batch and self.batch_inflight >= self.batch_cap
            ):
                self.queue.push_front(job)  # refunded; it goes first when a slot frees
                return None
            if job.grant():
                self._take(batch)
                return job
        return None

    def _next_waiting(self) -> Job | None:
        while True:
            job = self.queue.pop(allow_batch=self.batch_inflight < self.batch_cap)
            if job is None or not (job.cancelled or job.granted.done()):
                return job


def _was_granted(job: Job) -> bool:
    granted = job.granted
    return granted.done() and not granted.cancelled() and granted.exception() is None
