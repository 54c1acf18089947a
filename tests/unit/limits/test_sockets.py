"""Open WebSocket connections per key: a cap per key, places given back on close."""

from __future__ import annotations

from app.limits.sockets import SocketCounts


def test_a_key_holds_at_most_its_cap_and_gets_places_back() -> None:
    counts = SocketCounts()
    assert counts.take("a", 2) and counts.take("a", 2)
    assert not counts.take("a", 2) and counts.held("a") == 2
    assert counts.take("b", 1)  # another key is not affected
    counts.give_back("a")
    assert counts.take("a", 2) and counts.held("a") == 2
    for _ in range(3):  # giving back more than held never goes negative
        counts.give_back("b")
    assert counts.held("b") == 0 and counts.take("b", 1)
