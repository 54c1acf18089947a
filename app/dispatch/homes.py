"""Where each stored response lives and whose it is: response id -> (domain, owner key).

The Responses API keeps state upstream: a response stored by one domain's upstream can
be read, deleted, cancelled or continued (`previous_response_id`) only there. The
gateway learns the id when the answer names it and records its home:

    ResponseHomes.remember(id, Home)  ── the database (`response_owners`), awaited before
                                         the client sees the id; then the local cache
    ResponseHomes.where(id)  ── local LRU (bounded, TTL) ──hit──► Home
                                 │ miss
                                 └► the database: the only authority on ownership

The cache only holds what the database said (or was told) for this process, so it can
forget (eviction, restart, another worker) but never say more than the database: a miss
always asks the database, and an id it does not know is unknown, to every key. With the
database unreachable, a follow-up the cache can not vouch for is refused (503), never
let through.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from app.db.engine import DatabaseUnavailable
from app.db.owners import ResponseOwners
from app.errors import ServiceUnavailable

log = logging.getLogger("tokengate.responses")


@dataclass(frozen=True, slots=True)
class Home:
    domain: str
    owner: str  # the key alias that created it: no other key may use it


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


class ResponseHomes:
    def __init__(self, local: LocalHomes, owners: ResponseOwners) -> None:
        self.local = local
        self.owners = owners

    async def remember(self, response_id: str, home: Home) -> None:
        """Record the owner; if the database can not take it, the response stays private
        (no row: unknown to every key once this process forgets it)."""
        self.local.remember(response_id, home)
        try:
            await self.owners.record(response_id, home.owner, home.domain)
        except DatabaseUnavailable as exc:
            log.error("owner of response %s not recorded: %s", response_id[:64], exc)

    async def where(self, response_id: str) -> Home | None:
        home = self.local.where(response_id)
        if home is not None:
            return home
        try:
            found = await self.owners.find(response_id)
        except DatabaseUnavailable:
            raise ServiceUnavailable(
                "stored responses can not be checked while the database is unreachable",
                code="database_unavailable",
                retry_after=5.0,
            ) from None
        if found is None:
            return None
        home = Home(found.domain, found.owner)
        self.local.remember(response_id, home)
        return home

    async def forget(self, response_id: str) -> None:
        self.local.forget(response_id)
        try:
            await self.owners.drop(response_id)
        except DatabaseUnavailable as exc:  # the row expires with `id_ttl_sec`
            log.error("owner of deleted response %s not dropped: %s", response_id[:64], exc)
