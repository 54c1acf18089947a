"""Budgets: what a key or team may spend per period, and the arithmetic of holding to it.

A budget caps one metric (`cost` in nano-units, or `tokens`) of one scope (a key or a
team) over one calendar period (periods.py). Admission reserves a request's estimate
against every budget of its key and of the key's team, and only if every one of them
still has room for it (`used + estimate <= limit`); the answer settles the reservation
to what was consumed. So the spend of a period can pass its limit only by the amount
the requests in flight consumed beyond their estimates (the estimate is the prompt
estimate and the whole output allowance, so that is rare and small).

The `Tally` is one process's view, per (scope, owner, period id):

    used = base      the durable spend table plus this process's unflushed ledger rows,
                     as of the last `refresh` (every replica's settled spend, < 2 s old)
         + since     settled here since that refresh
         + reserved  in flight here

`refresh` replaces `base` and clears `since` in one step, with nothing settled in
between (the caller reads both sources under the ledger's lock), so a settled request
is always counted exactly once. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from app.billing.periods import Period, Window

Metric = Literal["cost", "tokens"]
Scope = Literal["key", "team"]
SpendKey = tuple[str, str, str]  # (scope, owner, period id)
_INDEX = {"cost": 0, "tokens": 1}


class Amount(NamedTuple):
    cost: int  # nano-units
    tokens: int

    def of(self, metric: Metric) -> int:
        return self.cost if metric == "cost" else self.tokens


ZERO = Amount(0, 0)


@dataclass(frozen=True)
class Budget:
    scope: Scope
    owner: str
    period: Period
    metric: Metric
    limit: int  # nano-units for cost, tokens for tokens

    @property
    def name(self) -> str:
        """`month_cost`, `day_tokens`...: unique per scope and owner."""
        return f"{self.period}_{self.metric}"


class Over(NamedTuple):
    """Why a request was refused: the budget, its period, and the figures."""

    budget: Budget
    window: Window
    spent: int  # settled in this period
    reserved: int  # held by requests in flight
    need: int  # this request's estimate

    @property
    def limit(self) -> int:
        return self.budget.limit


class Tally:
    def __init__(self) -> None:
        self.durable: dict[SpendKey, Amount] = {}  # the spend table, as last read
        self.base: dict[SpendKey, Amount] = {}
        self.since: dict[SpendKey, list[int]] = {}
        self.reserved: dict[SpendKey, list[int]] = {}

    def spent(self, key: SpendKey) -> Amount:
        base = self.base.get(key, ZERO)
        since = self.since.get(key)
        if since is None:
            return base
        return Amount(base.cost + since[0], base.tokens + since[1])

    def held(self, key: SpendKey) -> Amount:
        held = self.reserved.get(key)
        return ZERO if held is None else Amount(held[0], held[1])

    def check(
        self, budgets: Iterable[Budget], windows: Mapping[Period, Window], need: Amount
    ) -> Over | None:
        """The first budget `need` does not fit in, or None when all have room."""
        base, since, reserved = self.base, self.since, self.reserved
        for budget in budgets:
            window = windows[budget.period]
            key = (budget.scope, budget.owner, window.id)
            i = _INDEX[budget.metric]
            spent = base[key][i] if key in base else 0
            if key in since:
                spent += since[key][i]
            held = reserved[key][i] if key in reserved else 0
            if spent + held + need[i] > budget.limit:
                return Over(budget, window, spent, held, need[i])
        return None

    def reserve(self, keys: Sequence[SpendKey], amount: Amount) -> None:
        _add(self.reserved, keys, amount, 1)

    def release(self, keys: Sequence[SpendKey], amount: Amount) -> None:
        _add(self.reserved, keys, amount, -1)
        for key in keys:
            held = self.reserved.get(key)
            if held is not None and held[0] <= 0 and held[1] <= 0:
                del self.reserved[key]

    def settle(self, keys: Sequence[SpendKey], amount: Amount) -> None:
        _add(self.since, keys, amount, 1)

    def refresh(
        self, durable: Mapping[SpendKey, Amount], unflushed: Mapping[SpendKey, Amount]
    ) -> None:
        self.durable = dict(durable)
        base = dict(durable)
        for key, extra in unflushed.items():
            had = base.get(key, ZERO)
            base[key] = Amount(had.cost + extra.cost, had.tokens + extra.tokens)
        self.base = base
        self.since = {}


def _add(
    into: dict[SpendKey, list[int]], keys: Sequence[SpendKey], amount: Amount, sign: int
) -> None:
    for key in keys:
        row = into.get(key)
        if row is None:
            row = into[key] = [0, 0]
        row[0] += sign * amount.cost
        row[1] += sign * amount.tokens
