"""Which domain serves a request (pure).

Candidates are the domains whose model list contains the model (a domain whose list
is not known yet, because discovery has not answered, is assumed to serve it and the
upstream decides); a key's `domain` pins it to that one. Policy, in order:
available domains first (health probe not failing, circuit not open), then the
lowest expected wait `(outstanding + 1) * recent_latency / weight`, where
outstanding = in flight + queued and recent latency is an EWMA of upstream attempts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    def serves(self, model: str) -> bool: ...

    def available(self) -> bool: ...

    def expected_wait(self) -> float: ...


C = TypeVar("C", bound="Candidate")


def serving(domains: Sequence[C], model: str, pinned: str | None) -> list[C]:
    return [d for d in domains if (pinned is None or d.name == pinned) and d.serves(model)]


def rank(candidates: Sequence[C]) -> list[C]:
    """Available candidates, best first; empty if none is available."""
    if len(candidates) == 1:  # the common deployment: nothing to sort
        return [candidates[0]] if candidates[0].available() else []
    return sorted((d for d in candidates if d.available()), key=lambda d: d.expected_wait())
