"""Budgets: what a key or team may spend per period, and the arithmetic of holding to it.

A budget caps one metric (`cost` in nano-units, or `tokens`) of one scope (a key or a
team) over one calendar period (periods.py). Admission reserves what a request may
consume (`Ask`: the prompt estimate plus its whole output allowance, never a trainable
estimate) against every budget of its key and of the key's team, and only if every one
of them still has room for it (`used + need <= limit`); the answer settles the
reservation to what was consumed. Where less is left than the allowance, a budget with
`on_short = "cap"` lowers the output cap the gateway sends upstream to what fits, one
with `"refuse"` refuses (`fit`). So the spend of a period can pass its limit only by what
the gateway cannot cap: its prompt estimate's error and failed attempts' prompts.

The `SpendSheet` is one process's view, per (scope, owner, period id):

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
from typing import NamedTuple

from app.billing.periods import Span
from app.config.section import OnShort
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope

SpendKey = tuple[str, str, str]  # (scope, owner, period id)
_INDEX = {"cost": 0, "tokens": 1}


class Amount(NamedTuple):
    """Cost and tokens (a pair: the ledger and the shared stores read it as one)."""

    cost: int  # nano-units
    tokens: int

    def of(self, metric: BudgetMetric) -> int:
        return self.cost if metric == "cost" else self.tokens


ZERO = Amount(0, 0)


@dataclass(slots=True, init=False)
class Ask:
    """What a request may consume: `base` (its prompt), plus `unit` per output token of
    its allowance (per token and choice: all choices' cost and tokens), up to `most`.

    (Built on every request: its `__init__` is written out, so the compiled build runs it
    as C; docs/development.md, "The compiled build", says why.)"""

    base: Amount
    unit: Amount
    most: int

    def __init__(self, base: Amount, unit: Amount = ZERO, most: int = 0) -> None:
        self.base = base
        self.unit = unit
        self.most = most

    def need(self, k: int) -> Amount:
        """Held for an output cap of `k` tokens."""
        return Amount(self.base.cost + k * self.unit.cost, self.base.tokens + k * self.unit.tokens)


def fit(ask: Ask, rooms: Sequence[tuple[int, int, bool]]) -> int:
    """The output cap every budget has room for, or -1 - i when budget i refuses.

    `rooms`, per budget, per metric index: (room left: limit - spent - held, the
    metric's index 0 cost | 1 tokens, may cap). Budgets that may cap lower the cap to
    what fits them; every budget must then hold the request at that cap. No room for a
    single output token (of a request that generates) refuses too."""
    k = ask.most
    for room, i, may_cap in rooms:
        if may_cap and ask.unit[i] > 0:
            k = min(k, (room - ask.base[i]) // ask.unit[i])
    for n, (room, i, _) in enumerate(rooms):
        if ask.base[i] + max(k, 0) * ask.unit[i] > room or (k < 1 and ask.most > 0):
            return -1 - n
    return k


@dataclass(frozen=True)
class Budget:
    scope: BudgetScope
    owner: str
    period: BudgetPeriod
    metric: BudgetMetric
    limit: int  # nano-units for cost, tokens for tokens
    on_short: OnShort = "refuse"  # less left than a request's allowance: refuse or cap it

    @property
    def name(self) -> str:
        """`month_cost`, `day_tokens`...: unique per scope and owner."""
        return f"{self.period}_{self.metric}"


class Over(NamedTuple):
    """Why a request was refused: the budget, its period, and the figures."""

    budget: Budget
    window: Span
    spent: int  # settled in this period
    reserved: int  # held by requests in flight
    need: int  # this request's estimate

    @property
    def limit(self) -> int:
        return self.budget.limit


class SpendSheet:
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
        self, budgets: Iterable[Budget], windows: Mapping[BudgetPeriod, Span], need: Amount
    ) -> Over | None:
        """The first budget `need` does not fit in, or None when all have room."""
        found = self.fit(budgets, windows, Ask(need))
        return found if isinstance(found, Over) else None

    def fit(
        self, budgets: Iterable[Budget], windows: Mapping[BudgetPeriod, Span], ask: Ask
    ) -> Over | int:
        """The output cap `ask` gets (`fit`), or the budget that refuses it."""
        base, since, reserved = self.base, self.since, self.reserved
        rows: list[tuple[Budget, Span, int, int]] = []
        rooms: list[tuple[int, int, bool]] = []
        for budget in budgets:
            window = windows[budget.period]
            key = (budget.scope, budget.owner, window.id)
            i = _INDEX[budget.metric]
            spent = base[key][i] if key in base else 0
            if key in since:
                spent += since[key][i]
            held = reserved[key][i] if key in reserved else 0
            rows.append((budget, window, spent, held))
            rooms.append((budget.limit - spent - held, i, budget.on_short == "cap"))
        k = fit(ask, rooms)
        if k >= 0:
            return k
        budget, window, spent, held = rows[-1 - k]
        return Over(budget, window, spent, held, ask.need(ask.most).of(budget.metric))

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
