"""Which domain serves a request (pure).

Candidates are the domains whose model list contains the model (a domain whose list
is not known yet, because discovery has not answered, is assumed to serve it and the
upstream decides); a key's `domain` pins it to that one. Two policies order them:

- `rank` (no conversation to keep together, or `affinity.enabled = false`): available
  domains first (health probe not failing, circuit not open), then the lowest expected
  wait `(outstanding + 1) * recent_latency / weight`, where outstanding = in flight +
  queued and recent latency is an EWMA of upstream attempts;
- `preference` and `place` (a conversation, see affinity.py): each session ranks the
  domains by weighted rendezvous hashing (HRW: `weight / -ln(hash(session, domain))`,
  highest first) and a new session takes the first available one that stays within
  the bound of bounded-load consistent hashing, counted in sessions:

      sessions(d) + 1  <=  ceil(load_factor * (all sessions + 1) * weight(d) / total weight)

  The bound always leaves room somewhere; a domain over `load_factor` times its
  weighted share of the mean takes no new sessions. A domain that fails moves exactly
  the sessions placed on it (the HRW property: every other session's first choice
  among the rest is unchanged).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
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


C = TypeVar("C", bound="Candidate")
W = TypeVar("W", bound="Weighted")


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


def place(order: Sequence[W], loads: Mapping[str, float], load_factor: float) -> W | None:
    """The first of `order` (a session's preference, available domains only) whose load
    stays within the bound once it takes one more; None if `order` is empty."""
    if not order:
        return None
    total = sum(loads.get(d.name, 0) for d in order) + 1
    weights = sum(d.weight for d in order)
    for d in order:
        if loads.get(d.name, 0) + 1 <= math.ceil(load_factor * total * d.weight / weights):
            return d
    return order[0]  # unreachable: the bounds add up to more than the total


def _score(session: bytes, domain: Weighted) -> float:
    digest = hashlib.blake2b(session, digest_size=8, key=domain.name.encode()[:64]).digest()
    unit = (int.from_bytes(digest, "big") + 1) / 2.0**64  # in (0, 1]
    return -domain.weight / math.log(unit) if unit < 1.0 else math.inf
