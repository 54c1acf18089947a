"""The budget tally's arithmetic: check, reserve, settle, refresh (pure, no clock)."""

from __future__ import annotations

import random

from app.billing.budget_rules import ZERO, Amount, Ask, Budget, Over, SpendSheet, fit
from app.billing.periods import Calendar
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope

CAL = Calendar("UTC")
WINDOWS = {w.period: w for w in CAL.windows(1_800_000_000)}
DAY = WINDOWS[BudgetPeriod.DAY].id
COST = Budget(BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.COST, 1000)
TOKENS = Budget(BudgetScope.TEAM, "ml", BudgetPeriod.MONTH, BudgetMetric.TOKENS, 50)


def test_a_request_is_held_only_when_every_budget_has_room_for_it() -> None:
    t = SpendSheet()
    assert t.check([COST, TOKENS], WINDOWS, Amount(600, 30)) is None
    keys = [("key", "alice", DAY), ("team", "ml", WINDOWS[BudgetPeriod.MONTH].id)]
    t.reserve(keys, Amount(600, 30))
    over = t.check([COST, TOKENS], WINDOWS, Amount(300, 30))  # cost fits, tokens do not
    assert over is not None and over.budget == TOKENS
    assert (over.spent, over.reserved, over.need) == (0, 30, 30)


def test_settling_replaces_the_estimate_with_what_was_consumed() -> None:
    t = SpendSheet()
    key = ("key", "alice", DAY)
    t.reserve([key], Amount(600, 0))
    t.release([key], Amount(600, 0))
    t.settle([key], Amount(250, 0))
    assert (t.spent(key), t.held(key)) == (Amount(250, 0), ZERO)
    assert t.check([COST], WINDOWS, Amount(750, 0)) is None
    assert t.check([COST], WINDOWS, Amount(751, 0)) is not None


def test_a_refresh_takes_the_durable_spend_and_forgets_what_it_already_holds() -> None:
    t = SpendSheet()
    key = ("key", "alice", DAY)
    t.settle([key], Amount(100, 5))  # settled here, not flushed yet
    t.reserve([key], Amount(40, 1))
    # the database has another replica's 300; our 100 is still in the ledger's buffer
    t.refresh({key: Amount(300, 7)}, {key: Amount(100, 5)})
    assert t.spent(key) == Amount(400, 12)  # each settled request exactly once
    assert t.held(key) == Amount(40, 1)  # reservations survive a refresh


def test_concurrent_reservations_never_pass_the_limit_by_more_than_their_estimate_errors() -> None:
    rng = random.Random(24)
    budget = Budget(BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.COST, 10_000)
    key = [("key", "alice", DAY)]
    t, estimate = SpendSheet(), Amount(400, 0)
    inflight: list[int] = []
    error = 0
    for _ in range(60):  # 60 arrive together, then all answer
        if t.check([budget], WINDOWS, estimate) is None:
            t.reserve(key, estimate)
            inflight.append(rng.randint(100, 600))  # sometimes more than estimated
    for actual in inflight:
        t.release(key, estimate)
        t.settle(key, Amount(actual, 0))
        error += max(0, actual - estimate.cost)
    assert len(inflight) == 25  # 25 x 400 = the whole budget, no more
    assert t.spent(key[0]).cost <= budget.limit + error


def test_a_request_holds_its_whole_allowance_or_is_refused_by_default() -> None:
    t, key = SpendSheet(), [("key", "alice", DAY)]
    budget = Budget(BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.TOKENS, 1000)
    ask = Ask(Amount(0, 10), Amount(0, 1), 400)  # a 10-token prompt, up to 400 out
    assert t.fit([budget], WINDOWS, ask) == 400
    t.reserve(key, ask.need(400))
    t.reserve(key, ask.need(400))
    over = t.fit([budget], WINDOWS, ask)  # 180 left: not the 410 it may consume
    assert isinstance(over, Over) and (over.reserved, over.need) == (820, 410)


def test_a_budget_that_caps_lowers_the_output_cap_to_what_is_left() -> None:
    t, key = SpendSheet(), [("key", "alice", DAY)]
    capped = Budget(
        BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.TOKENS, 1000, on_short="cap"
    )
    money = Budget(
        BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.COST, 10**6, on_short="cap"
    )
    ask = Ask(Amount(50, 10), Amount(1000, 2), 400)  # two choices: 2 tokens a step
    assert t.fit([capped, money], WINDOWS, ask) == 400
    t.reserve(key, ask.need(400))  # 810 tokens, 400,050 nano-units
    assert t.fit([capped, money], WINDOWS, ask) == 90  # 190 tokens left: (190 - 10) // 2
    t.reserve(key, ask.need(90))
    over = t.fit([capped, money], WINDOWS, ask)  # not one token of output is left
    assert isinstance(over, Over) and over.budget == capped
    # a budget that refuses must hold the request at the cap the others gave it
    refusing = Budget(BudgetScope.TEAM, "ml", BudgetPeriod.DAY, BudgetMetric.TOKENS, 100)
    assert isinstance(t.fit([refusing], WINDOWS, ask), Over)
    fresh = SpendSheet()
    assert (
        fresh.fit(
            [
                Budget(BudgetScope.KEY, "a", BudgetPeriod.DAY, BudgetMetric.TOKENS, 60, "cap"),
                refusing,
            ],
            WINDOWS,
            ask,
        )
        == 25
    )


def test_fit_is_exact_at_the_edge_for_any_room() -> None:
    rng = random.Random(31)
    for _ in range(500):
        base, unit, most = rng.randint(0, 50), rng.randint(1, 5), rng.randint(1, 300)
        room = rng.randint(0, 2000)
        ask = Ask(Amount(0, base), Amount(0, unit), most)
        k = fit(ask, [(room, 1, True)])
        if k < 0:
            assert base + unit > room  # not one token fits
        else:
            assert 1 <= k <= most and base + k * unit <= room
            assert k == most or base + (k + 1) * unit > room  # and no more would
