"""Budgets held across replicas through Redis (`budget.lua`), one call per scope.

    reserve: key scope ─► budget.lua ─► team scope ─► budget.lua      (one hash tag each)
                 refused by the team: the key's hold is given back at once
                 capped lower by the team (`on_short = "cap"`): the key's hold shrinks
    settle:  per scope, the hold released and what was consumed added
    every second: the holds of requests still running are renewed

Each call decides in Redis, against every replica's settled spend and holds, whether the
request fits every budget of that scope, and holds it there, so the budget is exact
across replicas as it is in one process. Holds are per request and lapse unless renewed
(`HOLD_MS`), so a settle lost on the way or a replica that died leaves nothing held for
long; `spent` is raised on every call to the durable spend table as the caller last read
it. So when Redis loses its data (a restart without persistence) a budget can be passed
by what was spent in the last flush interval and refresh (about two seconds) and by the
requests then in flight; a lost settle is made up for once its ledger row is flushed.

`run` answers None when Redis did not answer: the caller then decides alone.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from app.billing.budget_rules import ZERO, Amount, Ask, Budget, Over, SpendKey
from app.billing.periods import Span
from app.kinds import BudgetMetric, BudgetPeriod
from app.state.scripts import Script

BUDGET = Script.of("app.billing", "budget.lua")
HOLD_MS = 15_000  # a hold lapses unless renewed; renewed every second while its request runs
GRACE_MS = 86_400_000  # a period's keys outlive its end by a day
TOTAL_TTL_MS = 35 * 86_400_000  # `total` never ends: kept while used, rebuilt if not
# (keys, args) -> the script's answer, or None when Redis did not answer
Run = Callable[[Sequence[str], Sequence[object]], Awaitable[Any | None]]
ScopeOwner = tuple[str, str]  # (scope, owner)


class SharedSpend:
    def __init__(self, run: Run, *, prefix: str, replica: str) -> None:
        self.run = run
        self.prefix = prefix
        # unique per process lifetime, so a restarted process never meets its own old holds
        self.replica = f"{replica}:{os.urandom(3).hex()}"
        self._n = 0

    def hold_id(self) -> str:
        self._n += 1
        return f"{self.replica}:{self._n}"

    def key(self, spend: SpendKey) -> str:
        scope, owner, period_id = spend
        return f"{self.prefix}budget:{{{scope}:{owner}}}:{period_id}"

    def keys(self, spends: Sequence[SpendKey]) -> list[str]:
        """Per period, its hash and the sorted set of its holds (one hash tag)."""
        return [k for s in spends for k in (self.key(s), self.key(s) + ":holds")]

    @staticmethod
    def member(hold_id: str, need: Amount) -> str:
        """How budget.lua names a hold (it builds the same text)."""
        return f"{hold_id} {need.cost} {need.tokens}"

    async def reserve(
        self,
        budgets: Sequence[Budget],
        windows: Mapping[BudgetPeriod, Span],
        ask: Ask,
        durable: Mapping[SpendKey, Amount],
        hold_id: str,
        now: float,
    ) -> Over | int | None:
        """The output cap held in every scope (`ask.need(cap)`); an `Over`: refused
        (holds given back); None: Redis did not answer (holds given back too)."""
        held: list[list[SpendKey]] = []
        cap = ask.most
        for (scope, owner), group in _by_scope(budgets):
            periods = list(dict.fromkeys(b.period for b in group))
            spends = [(scope, owner, windows[p].id) for p in periods]
            args: list[object] = ["reserve", ask.base.cost, ask.base.tokens]
            args += [ask.unit.cost, ask.unit.tokens, cap, hold_id, HOLD_MS]
            for period, spend in zip(periods, spends, strict=True):
                base = durable.get(spend, ZERO)
                of = {b.metric: b for b in group if b.period == period}
                args += [base.cost, base.tokens, *_limits(of), _ttl(windows[period], now)]
            answer = await self.run(self.keys(spends), args)
            if answer is None or int(answer[0]) != 1:
                for spent_in in held:
                    await self.settle(
                        spent_in, [], ask.need(cap), ZERO, hold_id, durable, windows, now
                    )
            if answer is None:
                return None
            if int(answer[0]) != 1:
                i, metric, spent, holding = (int(v) for v in answer[1:5])
                name = "cost" if metric == 1 else "tokens"
                (budget,) = [b for b in group if b.period == periods[i - 1] and b.metric == name]
                need = ask.need(ask.most).of(budget.metric)
                return Over(budget, windows[budget.period], spent, holding, need)
            got = int(answer[1])
            if got < cap:  # this scope has less room: the scopes held before shrink to it
                for spent_in in held:
                    await self.resize(spent_in, ask.need(cap), ask.need(got), hold_id)
                cap = got
            held.append(spends)
        return cap

    async def resize(
        self, spends: Sequence[SpendKey], was: Amount, now: Amount, hold_id: str
    ) -> None:
        """A hold made at `was` becomes `now` (smaller), its lapse pushed back."""
        args = ["resize", *was, *now, hold_id, HOLD_MS]
        await self.run(self.keys(spends), args)

    async def settle(
        self,
        reserved: Sequence[SpendKey],
        current: Sequence[SpendKey],
        need: Amount,
        actual: Amount,
        hold_id: str,
        durable: Mapping[SpendKey, Amount],
        windows: Mapping[BudgetPeriod, Span],
        now: float,
    ) -> bool:
        """Of one scope: release the hold from the periods it was made in, add `actual`
        to the periods it ends in. False when Redis did not answer."""
        spends = list(dict.fromkeys([*reserved, *current]))
        args: list[object] = ["settle", need.cost, need.tokens, actual.cost, actual.tokens]
        args.append(hold_id)
        ids = {w.id: w for w in windows.values()}
        for spend in spends:
            base = durable.get(spend, ZERO)
            release, add = spend in reserved, spend in current and actual != ZERO
            args += [base.cost, base.tokens, int(release), int(add)]
            args.append(_ttl(ids.get(spend[2]), now))
        return await self.run(self.keys(spends), args) is not None

    async def renew(self, holds: Mapping[SpendKey, Sequence[str]]) -> None:
        """Push back the lapse of these holds (members per spend key), one call per scope."""
        by_scope: dict[ScopeOwner, list[SpendKey]] = {}
        for spend in holds:
            by_scope.setdefault((spend[0], spend[1]), []).append(spend)
        for spends in by_scope.values():
            args: list[object] = ["renew", HOLD_MS]
            for spend in spends:
                args += [len(holds[spend]), *holds[spend]]
            await self.run(self.keys(spends), args)


def _by_scope(budgets: Sequence[Budget]) -> list[tuple[ScopeOwner, list[Budget]]]:
    out: dict[ScopeOwner, list[Budget]] = {}
    for b in budgets:
        out.setdefault((b.scope, b.owner), []).append(b)
    return list(out.items())


def _limits(of: Mapping[BudgetMetric, Budget]) -> list[int]:
    """budget.lua's limit_c, limit_t, cap_c, cap_t of one period (limit -1: none)."""
    c, t = of.get(BudgetMetric.COST), of.get(BudgetMetric.TOKENS)
    return [
        -1 if c is None else c.limit,
        -1 if t is None else t.limit,
        int(c is not None and c.on_short == "cap"),
        int(t is not None and t.on_short == "cap"),
    ]


def _ttl(w: Span | None, now: float) -> int:
    if w is None:  # a period that has ended
        return GRACE_MS
    if w.end is None:
        return TOTAL_TTL_MS
    return max(1000, int((w.end - now) * 1000) + GRACE_MS)
