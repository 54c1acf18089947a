"""A domain's state is a closed set (`DomainState`), worst first, and the status page's
alerts read the members, not their spelling; the words shown stay the same."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from app.api.snapshot import _domain
from app.dispatch.domain import Domain
from app.kinds import DomainState


def domain(
    *, open_: bool = False, healthy: bool | None = True, empty: bool = False, cooling: float = 0.0
) -> Domain:
    stub: Any = SimpleNamespace
    return Domain(
        spec=stub(name="a", api_base="http://up"),
        client=stub(),
        dispatcher=stub(pacer=stub(cooling=lambda: cooling), queue=[]),
        breaker=stub(is_open=open_),
        budget=stub(),
        healthy=healthy,
        quota_exhausted=empty,
    )


@pytest.mark.parametrize(
    ("made", "state", "alert"),
    [
        (domain(open_=True, healthy=False, empty=True), DomainState.CIRCUIT_OPEN, "circuit open"),
        (domain(healthy=False, empty=True), DomainState.UNHEALTHY, "health probe fails"),
        (domain(empty=True, cooling=3.0), DomainState.QUOTA_EXHAUSTED, "balance is exhausted"),
        (domain(cooling=3.0), DomainState.THROTTLED, "cooling down 3.0s"),
        (domain(), DomainState.HEALTHY, None),
        (domain(healthy=None), DomainState.UNKNOWN, None),
    ],
)
def test_the_worst_state_wins_and_the_status_page_alerts_on_it(
    made: Domain, state: DomainState, alert: str | None
) -> None:
    assert made.state() is state
    assert json.dumps({"state": made.state()}) == json.dumps({"state": state.value})
    alerts = [text for _, text in _domain(made, capacity=100)]
    assert len(alerts) == (alert is not None)
    assert alert is None or alert in alerts[0]
