"""The budget tally's arithmetic: check, reserve, settle, refresh (pure, no clock)."""

from __future__ import annotations

import random

from app.billing.budgets import ZERO, Amount, Budget, Tally
from app.billing.periods import Calendar

CAL = Calendar("UTC")
WINDOWS = {w.period: w for w in CAL.windows(1_800_000_000)}
DAY = WINDOWS["day"].id
COST = Budget("key", "alice", "day", "cost", 1000)
TOKENS = Budget("team", "ml", "month", "tokens", 50)


def test_a_request_is_held_only_when_every_budget_has_room_for_it() -> None:
    t = Tally()
    assert t.check([COST, TOKENS], WINDOWS, Amount(600, 30)) is None
    keys = [("key", "alice", DAY), ("team", "ml", WINDOWS["month"].id)]
    t.reserve(keys, Amount(600, 30))
    over = t.check([COST, TOKENS], WINDOWS, Amount(300, 30))  # cost fits, tokens do not
    assert over is not None and over.budget == TOKENS
    assert (over.spent, over.reserved, over.need) == (0, 30, 30)


def test_settling_replaces_the_estimate_with_what_was_consumed() -> None:
    t = Tally()
    key = ("key", "alice", DAY)
    t.reserve([key], Amount(600, 0))
    t.release([key], Amount(600, 0))
    t.settle([key], Amount(250, 0))
    assert (t.spent(key), t.held(key)) == (Amount(250, 0), ZERO)
    assert t.check([COST], WINDOWS, Amount(750, 0)) is None
    assert t.check([COST], WINDOWS, Amount(751, 0)) is not None


def test_a_refresh_takes_the_durable_spend_and_forgets_what_it_already_holds() -> None:
    t = Tally()
    key = ("key", "alice", DAY)
    t.settle([key], Amount(100, 5))  # settled here, not flushed yet
    t.reserve([key], Amount(40, 1))
    # the database has another replica's 300; our 100 is still in the ledger's buffer
    t.refresh({key: Amount(300, 7)}, {key: Amount(100, 5)})
    assert t.spent(key) == Amount(400, 12)  # each settled request exactly once
    assert t.held(key) == Amount(40, 1)  # reservations survive a refresh


def test_concurrent_reservations_never_pass_the_limit_by_more_than_their_estimate_errors() -> None:
    rng = random.Random(24)
    budget = Budget("key", "alice", "day", "cost", 10_000)
    key = [("key", "alice", DAY)]
    t, estimate = Tally(), Amount(400, 0)
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
