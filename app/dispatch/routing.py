"""Which domain serves a request (pure).

Candidates are the domains whose model list contains the model (a domain whose list
is not known yet, because discovery has not answered, is assumed to serve it and the
upstream decides); a key's `domain` pins it to that one. Two policies order them:

- `rank` (no conversation to keep together, or `affinity.enabled = false`): available
  domains first (health probe not failing, circuit not open), then the lowest expected
  wait `(outstanding + 1) * recent_latency / weight`, where outstanding = in flight +
  queued and recent latency is an EWMA of upstream attempts;
- `affine` (a conversation): the requests of one session go to the same domain, whose
  upstream prompt cache then holds their shared prefix. Each session ranks the domains
  by weighted rendezvous hashing (HRW: `weight / -ln(hash(session, domain))`, highest
  first), and takes the first available one whose load stays within the bound
  (bounded-load consistent hashing):

      load(d) + 1  <=  ceil(load_factor * (total load + 1) * weight(d) / total weight)

  load = outstanding requests. The bound always leaves room somewhere, so nothing
  waits for it; a domain over `load_factor` times its weighted share of the mean takes
  no new requests until it drains. A domain that fails (unavailable) moves exactly the
  sessions that ranked it first, each to its own next choice; every other session
  stays where it is (the HRW property), and comes back when it recovers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    def serves(self, model: str) -> bool: ...

    def available(self) -> bool: ...

    def expected_wait(self) -> float: ...


class Weighted(Candidate, Protocol):
    @property
    def weight(self) -> float: ...

    @property
    def load(self) -> int: ...


C = TypeVar("C", bound="Candidate")
W = TypeVar("W", bound="Weighted")


class Affinity(StrEnum):
    """How an affine request was placed (the `outcome` of tokengate_affinity_total)."""

    HOME = "home"  # the session's first choice
    SPILL = "spill"  # its first choice was over the load bound
    FAILOVER = "failover"  # its first choice was unavailable


def serving(domains: Sequence[C], model: str, pinned: str | None) -> list[C]:
    return [d for d in domains if (pinned is None or d.name == pinned) and d.serves(model)]


def rank(candidates: Sequence[C]) -> list[C]:
    """Available candidates, best first; empty if none is available."""
    if len(candidates) == 1:  # the common deployment: nothing to sort
        return [candidates[0]] if candidates[0].available() else []
    return sorted((d for d in candidates if d.available()), key=lambda d: d.expected_wait())


def preference(candidates: Sequence[W], session: bytes) -> list[W]:
    """The session's order of the candidates (weighted rendezvous hashing)."""
    return sorted(candidates, key=lambda d: _score(session, d), reverse=True)


def affine(
    candidates: Sequence[W], session: bytes, load_factor: float
) -> tuple[list[W], Affinity | None]:
    """Available candidates for this session, its domain first, then its next choices;
    and how it was placed (None if no candidate is available)."""
    order = preference(candidates, session)
    up = [d for d in order if d.available()]
    if not up:
        return [], None
    total = sum(d.load for d in up) + 1
    weights = sum(d.weight for d in up)
    chosen = next(
        (d for d in up if d.load + 1 <= math.ceil(load_factor * total * d.weight / weights)),
        up[0],  # unreachable: the bounds add up to more than the total
    )
    if chosen is order[0]:
        placed = Affinity.HOME
    else:
        placed = Affinity.SPILL if up[0] is order[0] else Affinity.FAILOVER
    return [chosen, *(d for d in up if d is not chosen)], placed


def _score(session: bytes, domain: Weighted) -> float:
    digest = hashlib.blake2b(session, digest_size=8, key=domain.name.encode()[:64]).digest()
    unit = (int.from_bytes(digest, "big") + 1) / 2.0**64  # in (0, 1]
    return -domain.weight / math.log(unit) if unit < 1.0 else math.inf
