"""Where each stored response lives: response id -> (domain, key that created it).

The Responses API keeps state upstream: a response stored by one domain's upstream can
be read, deleted, cancelled or continued (`previous_response_id`) only there. The
gateway learns the id when the answer names it and remembers its home here:

    ResponseHomes.where(id)  ── local LRU (bounded, TTL) ──hit──► Home
                                 │ miss
                                 └► shared store (Redis: one key per id, with the TTL),
                                    so a follow-up sent to another replica finds it

Writes to the shared store are handed to the gateway (`spawn`): they never delay an
answer. The shared store answers None while unreachable (a miss: the caller then asks
the domains in turn), so an outage costs a probe, never a request.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

Spawn = Callable[[Coroutine[Any, Any, None]], None]


@dataclass(frozen=True, slots=True)
class Home:
    domain: str
    owner: str  # the key alias that created it: no other key may use it

    def encode(self) -> str:
        # Domain names and aliases are tokens without spaces (the schema's patterns).
        return f"{self.domain} {self.owner}"

    @classmethod
    def decode(cls, raw: str) -> Home | None:
        domain, _, owner = raw.partition(" ")
        return cls(domain, owner) if domain and owner else None


class LocalHomes:
    """A bounded map with a TTL per entry (least recently used dropped first); pure,
    with an injected clock."""

    def __init__(
        self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[str, tuple[Home, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, response_id: str, home: Home) -> None:
        self._entries[response_id] = (home, self.clock() + self.ttl)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def where(self, response_id: str) -> Home | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry[1] <= self.clock():
            del self._entries[response_id]
            return None
        self._entries.move_to_end(response_id)
        return entry[0]

    def forget(self, response_id: str) -> None:
        self._entries.pop(response_id, None)


class SharedText(Protocol):
    """Small values with a TTL shared by every replica (`RedisStore` implements it)."""

    async def put_text(self, name: str, value: str, ttl_sec: float) -> None: ...

    async def get_text(self, name: str) -> str | None: ...

    async def delete_text(self, name: str) -> None: ...


class ResponseHomes:
    def __init__(self, local: LocalHomes, shared: SharedText | None, spawn: Spawn) -> None:
        self.local = local
        self.shared = shared
        self.spawn = spawn

    @staticmethod
    def _name(response_id: str) -> str:
        return f"resp:{{{response_id}}}"

    def remember(self, response_id: str, home: Home) -> None:
        self.local.remember(response_id, home)
        if self.shared is not None:
            self.spawn(self.shared.put_text(self._name(response_id), home.encode(), self.local.ttl))

    async def where(self, response_id: str) -> Home | None:
        home = self.local.where(response_id)
        if home is not None or self.shared is None:
            return home
        raw = await self.shared.get_text(self._name(response_id))
        home = Home.decode(raw) if raw else None
        if home is not None:
            self.local.remember(response_id, home)
        return home

    def forget(self, response_id: str) -> None:
        self.local.forget(response_id)
        if self.shared is not None:
            self.spawn(self.shared.delete_text(self._name(response_id)))
