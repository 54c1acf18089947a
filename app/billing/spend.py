"""Budgets at the door: reserve what a request may spend, settle it to the actual.

    admit ─► reserve(key, ask)    every budget of the key and of its team must have room
                │                 for `ask` (the prompt estimate and the whole output
                │                 allowance, in cost and tokens), else 429 `budget_exceeded`
                │                 naming the budget, its figures and reset; a budget with
                │                 `on_short = "cap"` lowers the allowance to what is left
                │                 (`Hold.cap`: the output cap the pipeline sends upstream)
                ▼
    finish ─► settle(hold, actual)   the reservation becomes what was consumed
                                     (nothing, if the request never reached the upstream)

    every second (after the ledger's flush) ─► refresh(): every replica's settled spend
    from the durable spend table, plus this process's unflushed ledger rows

In one process the check and the reservation are one synchronous step, so concurrent
requests can never jointly pass a budget: each holds all it may generate, and the
gateway sends that cap upstream (only a prompt estimate's error is not capped). Several
processes (replicas, `--workers N`) without Redis each see the others' spend once it is
flushed and read back: a budget can then be overshot by what the others spend in about
two seconds (`ledger.flush_interval_sec` + the 1 s refresh), on top of the estimate
error. After any restart the spend of the current
periods is read back from the database before the first request: a spent budget stays
spent.

With Redis (`shared`, shared_spend.py) the decision is Redis': every replica's spend
and holds, exact across replicas; this process's tally still follows its own requests,
and decides alone while Redis does not answer (as without Redis).

A model without a price cannot be counted against a cost budget, so a key (or team)
with one is refused it (403 `model_not_priced`) instead of spending unseen, and such a
fallback is skipped for it (app/pipeline/allowance.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.billing.books import BudgetOverride, SpendBook
from app.billing.budget_rules import ZERO, Amount, Ask, Budget, Over, SpendKey, SpendSheet
from app.billing.ledger import Ledger
from app.billing.periods import Calendar, Span
from app.billing.prices import render
from app.billing.shared_spend import SharedSpend
from app.config.schema import Settings
from app.errors import BudgetExceeded, ModelNotPriced
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope

OwnerPeriod = tuple[str, str, BudgetPeriod]  # (scope, owner, period)
# An answer waits at most this long for its hold's settle in Redis (one or two calls of
# `redis.timeout_ms` each): a safety net, never reached while Redis answers or fails.
RELEASE_WAIT_SEC = 2.0
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class SpendMetrics(Protocol):
    def record_budget_exceeded(self, scope: str, owner: str, budget: str) -> None: ...
    def set_budget_used(
        self, scope: str, owner: str, period: str, metric: str, r: float
    ) -> None: ...


@dataclass(slots=True)
class Hold:
    """One admitted request's reservation."""

    slots: tuple[OwnerPeriod, ...]
    keys: tuple[SpendKey, ...]  # the slots' spend keys when it was made
    need: Amount
    shared: str | None = None  # its id, when held in Redis
    gen: int = -1  # the periods it was made in (`SpendGate._gen`)
    cap: int = 0  # the output allowance held (per choice): at most the `Ask`'s `most`
    # done once Redis has the settle (or did not answer): the answer's end waits for it
    released: asyncio.Future[None] | None = None


@dataclass(frozen=True)
class OwnerView:
    """A key or team: its spend in each current period, and its budgets."""

    scope: str
    name: str
    team: str | None
    spend: dict[BudgetPeriod, tuple[Span, Amount]]
    budgets: list[BudgetState]


@dataclass(frozen=True)
class BudgetState:
    """A budget as the admin API and the status page show it."""

    budget: Budget
    configured: int | None  # the limit in the settings (None: set by an override only)
    override: BudgetOverride | None
    window: Span
    spent: int
    reserved: int

    @property
    def ratio(self) -> float:
        return self.spent / self.budget.limit if self.budget.limit else 1.0


class BudgetedKey(Protocol):
    """What the gate reads of a key (`app.runtime.KeySpec`)."""

    @property
    def alias(self) -> str: ...

    @property
    def team(self) -> str | None: ...

    @property
    def budgets(self) -> tuple[Budget, ...]: ...


class BudgetedTeam(Protocol):
    """What the gate reads of a team (`app.runtime.TeamSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def budgets(self) -> tuple[Budget, ...]: ...


class Budgeted(Protocol):
    """What the gate reads of the compiled configuration (`app.runtime.Runtime`, a
    floor above billing)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def keys(self) -> Sequence[BudgetedKey]: ...

    @property
    def teams(self) -> Sequence[BudgetedTeam]: ...


class SpendGate:
    def __init__(
        self,
        runtime: Budgeted,
        calendar: Calendar,
        *,
        metrics: SpendMetrics | None = None,
        clock: Callable[[], float] = time.time,
        spawn: Spawn | None = None,
    ) -> None:
        self.calendar = calendar
        self.spawn = spawn  # runs the Redis part of a settle (it must outlive a request)
        self.metrics = metrics
        self.clock = clock
        self.tally = SpendSheet()
        self.shared: SharedSpend | None = None  # set by the gateway when Redis is configured
        self._running: dict[str, Hold] = {}  # held in Redis, renewed until settled
        self.refused: set[tuple[str, str, str]] = set()  # (scope, owner, budget) that refused
        self._windows: dict[BudgetPeriod, Span] = {}
        self._since = self._until = 0.0  # when the current windows all hold
        self._gen = 0  # counts the windows' changes
        self._both: dict[str, tuple[Sequence[Budget], Sequence[Budget], Sequence[Budget]]] = {}
        # per key alias: (gen, budgets, slots, spend keys) of its last request
        self._plans: dict[
            str, tuple[int, Sequence[Budget], tuple[OwnerPeriod, ...], tuple[SpendKey, ...]]
        ] = {}
        self._overrides: dict[tuple[str, str], list[BudgetOverride]] = {}
        self.configure(runtime)

    def configure(self, runtime: Budgeted) -> None:
        """Budgets and currency from `runtime` (at start and on reload)."""
        self.currency = runtime.settings.billing.currency
        self.teams = {t.name: t.budgets for t in runtime.teams}
        self.keys = {k.alias: k for k in runtime.keys}

    # -- admission ------------------------------------------------------------------------
    async def reserve(self, key: BudgetedKey, ask: Ask | Amount, *, priced: bool) -> Hold | None:
        """Hold `ask` against every budget of `key` and its team; None when it has none.
        Raises `BudgetExceeded` (no room) or `ModelNotPriced` (cost unknowable)."""
        now = self.clock()
        budgets = self.budgets_of(key, now)
        if not budgets:
            return None
        if not priced and any(b.metric == "cost" for b in budgets):
            raise ModelNotPriced(
                f"this model has no price in billing.prices, and the {_owner(budgets[0])} "
                "has a cost budget that its spend would escape; ask the operator to price "
                "the model",
                param="model",
            )
        if isinstance(ask, Amount):
            ask = Ask(ask)
        windows = self.windows(now)
        slots, keys = self._slots(key.alias, budgets, windows)
        if self.shared is not None:
            hold = await self._shared(budgets, windows, slots, keys, ask, now)
            if hold is not None:
                return hold
        cap = self.tally.fit(budgets, windows, ask)
        if isinstance(cap, Over):
            raise self.refusal(cap)
        need = ask.need(cap)
        self.tally.reserve(keys, need)
        return Hold(slots, keys, need, gen=self._gen, cap=cap)

    def costs(self, key: BudgetedKey, now: float | None = None) -> bool:
        """The key or its team has a cost budget (an unpriced model's spend would escape
        it: such a model is refused, and skipped as a fallback)."""
        now = self.clock() if now is None else now
        return any(b.metric == "cost" for b in self.budgets_of(key, now))

    def _slots(
        self, alias: str, budgets: Sequence[Budget], windows: dict[BudgetPeriod, Span]
    ) -> tuple[tuple[OwnerPeriod, ...], tuple[SpendKey, ...]]:
        """The (scope, owner, period) a request holds in, and their spend keys now; kept
        per key while the periods and the budgets stand (the request path's cost)."""
        plan = self._plans.get(alias)
        if plan is not None and plan[0] == self._gen and plan[1] is budgets:
            return plan[2], plan[3]
        slots = tuple(dict.fromkeys((b.scope, b.owner, b.period) for b in budgets))
        keys = tuple((s, o, windows[p].id) for s, o, p in slots)
        self._plans[alias] = (self._gen, budgets, slots, keys)
        return slots, keys

    async def _shared(
        self,
        budgets: Sequence[Budget],
        windows: dict[BudgetPeriod, Span],
        slots: tuple[OwnerPeriod, ...],
        keys: tuple[SpendKey, ...],
        ask: Ask,
        now: float,
    ) -> Hold | None:
        """Redis decides; None when it did not answer (this process decides alone)."""
        assert self.shared is not None
        hold_id = self.shared.hold_id()
        durable = self.tally.durable
        decided = await self.shared.reserve(budgets, windows, ask, durable, hold_id, now)
        if decided is None:
            return None
        if isinstance(decided, Over):
            raise self.refusal(decided)
        need = ask.need(decided)
        self.tally.reserve(keys, need)  # this process's view, should Redis go away
        hold = Hold(slots, keys, need, hold_id, self._gen, decided)
        self._running[hold_id] = hold
        return hold

    def settle(self, hold: Hold, actual: Amount) -> None:
        """The reservation becomes `actual`, counted in the period it ends in (and in
        Redis, by a task handed to `spawn`, when it was held there). Never waits."""
        self.tally.release(hold.keys, hold.need)
        windows = self.windows(self.clock())
        current = (
            hold.keys
            if hold.gen == self._gen
            else tuple((s, o, windows[p].id) for s, o, p in hold.slots)
        )
        if actual != ZERO:
            self.tally.settle(current, actual)
        if hold.shared is not None:
            self._running.pop(hold.shared, None)
            if self.shared is not None and self.spawn is not None:
                hold.released = asyncio.get_running_loop().create_future()
                self.spawn(self._settle_shared(hold, current, actual, windows))

    async def _settle_shared(
        self,
        hold: Hold,
        current: tuple[SpendKey, ...],
        actual: Amount,
        windows: dict[BudgetPeriod, Span],
    ) -> None:
        assert self.shared is not None and hold.shared is not None
        now, durable = self.clock(), self.tally.durable
        try:
            for scope in dict.fromkeys(k[:2] for k in hold.keys):
                mine = [k for k in hold.keys if k[:2] == scope]
                ends = [k for k in current if k[:2] == scope]
                await self.shared.settle(
                    mine, ends, hold.need, actual, hold.shared, durable, windows, now
                )
        finally:
            if hold.released is not None and not hold.released.done():
                hold.released.set_result(None)

    @staticmethod
    async def released(hold: Hold | None) -> None:
        """Wait until Redis has the hold's settle (or did not answer): an answer ends only
        after that, so the client's next request, on any replica, never meets the hold
        of the one before (a budget refused early). Never cancels the settle."""
        if hold is not None and hold.released is not None and not hold.released.done():
            # bounded: a settle task cancelled before it ran would never say it is done
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(hold.released), RELEASE_WAIT_SEC)

    async def renew(self) -> None:
        """Once a second with Redis: push back the lapse of the holds of requests still
        running here (a hold nobody renews lapses: a lost settle, a dead replica)."""
        if self.shared is None or not self._running:
            return
        members: dict[SpendKey, list[str]] = {}
        for hold_id, hold in self._running.items():
            member = self.shared.member(hold_id, hold.need)
            for key in hold.keys:
                members.setdefault(key, []).append(member)
        await self.shared.renew(members)

    def refusal(self, over: Over) -> BudgetExceeded:
        b = over.budget
        self.refused.add((b.scope, b.owner, b.name))  # spend alerts: it is at 100 %
        if self.metrics is not None:
            self.metrics.record_budget_exceeded(b.scope, b.owner, b.name)
        spent, held, need, limit = (
            self.show(v, b.metric) for v in (over.spent, over.reserved, over.need, over.limit)
        )
        inflight = f" ({held} more held by requests in flight)" if over.reserved else ""
        if over.window.end is None:
            resets = "A total budget never resets: ask for a higher one."
        else:
            when = self.calendar.describe(over.window.end)
            resets = f"It resets at {when} ({self.calendar.timezone})."
        return BudgetExceeded(
            f"Budget exceeded: the {b.period} {b.metric} budget of {_owner(b)} has "
            f"{spent} of {limit} spent{inflight}, and this request needs up to {need}. "
            f"{resets}"
        )

    def show(self, value: int, metric: str) -> str:
        if metric == "cost":
            return f"{render(value)} {self.currency}"
        return f"{value:,} tokens"

    # -- budgets and periods ----------------------------------------------------------------
    def budgets_of(self, key: BudgetedKey, now: float) -> Sequence[Budget]:
        """The key's budgets and its team's, live overrides applied."""
        team = () if key.team is None else self.teams.get(key.team, ())
        if not self._overrides:  # the usual case: nothing built per request
            if not team:
                return key.budgets
            both = self._both.get(key.alias)
            if both is None or both[0] is not key.budgets or both[1] is not team:
                both = self._both[key.alias] = (key.budgets, team, key.budgets + team)
            return both[2]
        out = self._effective("key", key.alias, key.budgets, now)
        if key.team is not None:
            out += self._effective("team", key.team, team, now)
        return out

    def _effective(
        self, scope: str, owner: str, configured: Sequence[Budget], now: float
    ) -> list[Budget]:
        overrides = self._overrides.get((scope, owner))
        if not overrides:
            return list(configured)
        live = {(o.period, o.metric): o for o in overrides if o.until > now}
        out = [
            dataclasses.replace(b, limit=live.pop((b.period, b.metric)).limit)
            if (b.period, b.metric) in live
            else b
            for b in configured
        ]
        # The enums themselves, not their strings: a compiled `Budget` checks its fields'
        # types (an override's row holds plain strings).
        kind = BudgetScope(scope)
        out += [
            Budget(kind, owner, BudgetPeriod(p), BudgetMetric(m), o.limit)
            for (p, m), o in live.items()
        ]
        return out

    def windows(self, now: float) -> dict[BudgetPeriod, Span]:
        """The current period of each kind (recomputed only when one ends)."""
        if not self._since <= now < self._until:
            found = self.calendar.windows(now)
            self._windows = {w.period: w for w in found}
            ends = [w.end for w in found if w.end is not None]
            self._since = max(w.start for w in found if w.start is not None)
            self._until = min(ends)
            self._gen += 1
        return self._windows

    def windows_changed(self) -> None:
        """The calendar changed (time zone): periods are computed anew."""
        self._since, self._until = 0.0, 0.0

    def set_overrides(self, overrides: Iterable[BudgetOverride]) -> None:
        by_owner: dict[tuple[str, str], list[BudgetOverride]] = {}
        for o in overrides:
            by_owner.setdefault((o.scope, o.owner), []).append(o)
        self._overrides = by_owner

    def owners(self) -> list[tuple[str, str, Sequence[Budget]]]:
        """Every key and team with a budget (configured, or set by an override)."""
        out: list[tuple[str, str, Sequence[Budget]]] = [
            ("key", alias, k.budgets) for alias, k in self.keys.items()
        ]
        out += [("team", name, budgets) for name, budgets in self.teams.items()]
        return [(s, o, b) for s, o, b in out if b or (s, o) in self._overrides]

    # -- the durable view ---------------------------------------------------------------------
    async def refresh(self, ledger: Ledger, book: SpendBook) -> None:
        """Every replica's settled spend of the current periods, from the database plus
        this process's unflushed rows (read under the ledger's lock: each row once)."""
        now = self.clock()
        owners = [(s, o) for s, o, _ in self.owners()]
        if not owners:
            return
        ids = [w.id for w in self.windows(now).values()]
        async with ledger.lock:
            durable = await book.read(ids, owners)
            unflushed = ledger.unflushed_spend()
            self.tally.refresh({k: Amount(*v) for k, v in durable.items()}, unflushed)
        if self.metrics is not None:
            for state in self.states(now):
                b = state.budget
                self.metrics.set_budget_used(b.scope, b.owner, b.period, b.metric, state.ratio)

    def states(self, now: float | None = None) -> list[BudgetState]:
        """Every budget with its figures in this process's view (gauges, status page)."""
        now = self.clock() if now is None else now
        out: list[BudgetState] = []
        for scope, owner, configured in self.owners():
            out += self._states(scope, owner, configured, now, self.tally.spent)
        return out

    def view(
        self,
        owners: Sequence[tuple[str, str]],
        spent: Mapping[SpendKey, Amount],
        now: float,
    ) -> list[OwnerView]:
        """Spend of every period and the budgets of each owner, `spent` being the durable
        spend plus what is not flushed yet (the admin API reads it fresh)."""
        windows = self.windows(now)
        out = []
        for scope, owner in owners:
            if scope == "key":
                key = self.keys.get(owner)
                configured, team = (key.budgets, key.team) if key else ((), None)
            else:
                configured = self.teams.get(owner, ())
                team = None
            totals = {p: (w, spent.get((scope, owner, w.id), ZERO)) for p, w in windows.items()}
            budgets = self._states(scope, owner, configured, now, lambda k: spent.get(k, ZERO))
            out.append(OwnerView(scope, owner, team, totals, budgets))
        return out

    def _states(
        self,
        scope: str,
        owner: str,
        configured: Sequence[Budget],
        now: float,
        spent_of: Callable[[SpendKey], Amount],
    ) -> list[BudgetState]:
        windows = self.windows(now)
        limits = {b.name: b.limit for b in configured}
        overrides = {
            f"{o.period}_{o.metric}": o
            for o in self._overrides.get((scope, owner), ())
            if o.until > now
        }
        out = []
        for b in self._effective(scope, owner, configured, now):
            window = windows[b.period]
            key = (scope, owner, window.id)
            out.append(
                BudgetState(
                    b,
                    limits.get(b.name),
                    overrides.get(b.name),
                    window,
                    spent_of(key).of(b.metric),
                    self.tally.held(key).of(b.metric),
                )
            )
        return out


def _owner(b: Budget) -> str:
    return f"{b.scope} '{b.owner}'"
