"""Spend per agent session: bounded labels, spend per period, the cap's refusal."""

from __future__ import annotations

import pytest

from app.billing.budget_rules import Budget
from app.billing.periods import Calendar
from app.errors import SessionBudgetExceeded
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope
from app.limits.sessions import NONE, OTHER, SessionBook, clean, raw_session, session_refusal

DAY = 86_400.0
T0 = 1_794_312_000.0  # Tuesday 2026-11-10, noon UTC: the next day is in the same week and month


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def book(**kw: object) -> tuple[SessionBook, Clock]:
    clock = Clock()
    return SessionBook(Calendar("UTC"), clock=clock, **kw), clock  # type: ignore[arg-type]


def test_plain_ids_are_kept_and_anything_else_is_digested() -> None:
    assert clean("01a24543-cc8c-7322-b18b-d698064583b7") == "01a24543-cc8c-7322-b18b-d698064583b7"
    for hostile in ("x" * 65, "<script>alert(1)</script>", "a b", "é", "line\nbreak", "'; drop"):
        label = clean(hostile)
        assert label.startswith("h:") and len(label) == 18
    assert clean("a b") == clean("a b") != clean("a  b")  # stable, and distinct


def test_the_label_comes_from_the_header_else_prompt_cache_key_else_none() -> None:
    assert raw_session("hdr", {"prompt_cache_key": "pck"}) == "hdr"
    assert raw_session(None, {"prompt_cache_key": "pck"}) == "pck"
    assert raw_session(None, {"user": "u", "prompt_cache_key": 3}) is None
    b, _ = book()
    assert b.label("k", None) == NONE


def test_a_key_has_a_bounded_number_of_active_sessions() -> None:
    b, clock = book(max_per_key=3, idle_sec=60)
    assert [b.label("k", f"s{i}") for i in range(5)] == ["s0", "s1", "s2", OTHER, OTHER]
    assert b.label("other-key", "s9") == "s9"  # per key
    assert b.label("k", "s1") == "s1"  # a known one stays itself
    clock.now += 61  # all idle: room again
    assert b.label("k", "s7") == "s7"


def test_an_attacker_inventing_ids_grows_nothing_past_the_bound() -> None:
    b, _ = book(max_per_key=8)
    for i in range(10_000):
        label = b.label("k", f"id-{i}")
        b.add("k", label, 1, 1, b.periods_now(()))
    assert len(b._active["k"]) == 8
    assert len({s for (_, s, _) in b._spent}) == 9  # 8 sessions and ~other


def test_spend_adds_up_per_session_and_the_cap_refuses_only_that_session() -> None:
    b, clock = book()
    cap = (Budget(BudgetScope.KEY, "k", BudgetPeriod.DAY, BudgetMetric.TOKENS, 1000),)
    for _ in range(3):
        b.add("k", "loop", 400, 10, b.periods_now(cap))
    b.add("k", "calm", 100, 1, b.periods_now(cap))
    over = b.over("k", "loop", cap)
    assert over is not None and over[1].tokens == 1200
    assert b.over("k", "calm", cap) is None
    assert b.over("k", OTHER, cap) is None and b.over("k", NONE, cap) is None
    (first, second) = b.costliest(2)
    assert (first[1], first[2].cost, second[1]) == ("loop", 30, "calm")
    clock.now += DAY  # the next day: the session may go on
    assert b.over("k", "loop", cap) is None
    b.add("k", "calm", 1, 0, b.periods_now(cap))  # a new day forgets the old one's spend
    yesterday = Calendar("UTC").window(BudgetPeriod.DAY, clock.now - DAY).id
    assert all(period != yesterday for (_, _, period) in b._spent)


def test_the_refusal_says_what_was_spent_of_what_and_when_it_resets() -> None:
    b, _ = book()
    cap = (
        Budget(BudgetScope.KEY, "ci", BudgetPeriod.DAY, BudgetMetric.COST, 2_000_000_000),
    )  # 2 USD
    b.add("ci", "sess-1", 10, 2_500_000_000, b.periods_now(cap))
    over = b.over("ci", "sess-1", cap)
    assert over is not None
    err = session_refusal("ci", "sess-1", over, "USD")
    assert isinstance(err, SessionBudgetExceeded)
    assert err.status == 429 and err.code == "session_budget_exceeded"
    assert "sess-1" in err.message and "2.5 USD of its 2 USD per day" in err.message
    assert "resets at 2026-" in err.message and "'ci'" in err.message
    assert err.response_headers()["x-should-retry"] == "false"


@pytest.mark.parametrize("period", ["week", "month", "total"])
def test_longer_periods_count_too(period: str) -> None:
    b, clock = book()
    cap = (Budget("key", "k", period, "tokens", 10),)  # type: ignore[arg-type]
    b.add("k", "s", 10, 0, b.periods_now(cap))
    clock.now += DAY
    b.add("k", "s", 1, 0, b.periods_now(cap))  # a new day must not forget the week's spend
    assert b.over("k", "s", cap) is not None
