"""Prompt-cache affinity: the requests of one conversation go to one domain.

An upstream caches prompt prefixes per domain (its own GPUs hold the KV cache), so an
agent's turns, each repeating the whole conversation so far, are cheap only where the
previous turn ran. The session table remembers, per process, which domain each active
session was placed on:

    request of session s ──► s placed, its domain available ──► that domain     (home)
                │                   └─ the domain saturated (requests queued) and over
                │                      its load bound: this request only goes to the
                │                      session's next choice that is not      (spill)
                │
                └─ s new, or its domain unavailable / not serving the model:
                   placed by bounded-load rendezvous hashing over the available
                   domains, counted in sessions (routing.place)      (new / failover)

So a domain's failure moves its own sessions and no other (each to its own next
choice), a domain over `load_factor` times its share of the sessions takes no new
ones, and a moved session stays where it moved (its prefix is cached there now).
A session idle for `IDLE_SEC` is forgotten (at most `MAX_SESSIONS` are kept, the
least recently seen dropped first); if it comes back it is placed again, by the same
hash, so usually on the same domain. Replicas keep their own tables; as placement is
the same hash under the same bound, they mostly agree.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from app.dispatch.routing import Weighted, place, preference

IDLE_SEC = 900.0
MAX_SESSIONS = 100_000


class Loaded(Weighted, Protocol):
    @property
    def load(self) -> int:
        """Requests in flight or queued."""
        ...

    @property
    def saturated(self) -> bool:
        """Requests are waiting in its queue."""
        ...


L = TypeVar("L", bound=Loaded)


class Placement(StrEnum):
    """How a conversation's request was placed (the `outcome` of tokengate_affinity_total)."""

    HOME = "home"  # the session's domain
    NEW = "new"  # a session seen for the first time (or again after IDLE_SEC)
    SPILL = "spill"  # its domain saturated and over the load bound: this request elsewhere
    FAILOVER = "failover"  # its domain unavailable: the session moved


@dataclass(slots=True)
class _Entry:
    domain: str
    seen: float


class SessionTable:
    def __init__(
        self,
        load_factor: float = 1.25,
        *,
        idle_sec: float = IDLE_SEC,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.load_factor = load_factor
        self.idle_sec = idle_sec
        self.max_sessions = max_sessions
        self.clock = clock
        self.sessions: Counter[str] = Counter()  # active sessions per domain
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def order(self, candidates: Sequence[L], session: bytes) -> tuple[list[L], Placement | None]:
        """Available candidates, the one for this request first, then the session's
        other choices in its order; and how it was placed (None: none available)."""
        now = self.clock()
        self._expire(now)
        up = [d for d in preference(candidates, session) if d.available()]
        if not up:
            return [], None
        entry = self._entries.get(session)
        home = next((d for d in up if entry is not None and d.name == entry.domain), None)
        if home is not None:
            chosen, placed = home, Placement.HOME
            if self._overloaded(home, up):
                spare = next((d for d in up if d is not home and not d.saturated), None)
                if spare is not None:
                    chosen, placed = spare, Placement.SPILL
            entry = self._entries[session]
            entry.seen = now
            self._entries.move_to_end(session)
        else:
            found = place(up, self.sessions, self.load_factor)
            assert found is not None
            chosen = found
            placed = Placement.NEW if entry is None else Placement.FAILOVER
            self._assign(session, chosen.name, now)
        return [chosen, *(d for d in up if d is not chosen)], placed

    def _overloaded(self, home: Loaded, up: Sequence[Loaded]) -> bool:
        if not home.saturated:
            return False
        total = sum(d.load for d in up) + 1
        share = home.weight / sum(d.weight for d in up)
        return home.load + 1 > math.ceil(self.load_factor * total * share)

    def _assign(self, session: bytes, domain: str, now: float) -> None:
        old = self._entries.pop(session, None)
        if old is not None:
            self._forget(old.domain)
        self._entries[session] = _Entry(domain, now)
        self.sessions[domain] += 1
        while len(self._entries) > self.max_sessions:
            _, dropped = self._entries.popitem(last=False)
            self._forget(dropped.domain)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            session, oldest = next(iter(entries.items()))
            if now - oldest.seen < self.idle_sec:
                return
            del entries[session]
            self._forget(oldest.domain)

    def _forget(self, domain: str) -> None:
        self.sessions[domain] -= 1
        if self.sessions[domain] <= 0:
            del self.sessions[domain]
