"""Spend per agent session: the label a request is accounted under, what each session
spent, the cap that stops a runaway loop, and the costliest sessions now.

    label    the first the request carries: Claude Code's `x-claude-code-session-id`,
             Codex's `session-id` / `thread-id` headers (`session_id` / `thread_id` in
             older releases), `x-session-id`; else the body's `prompt_cache_key`; else
             none ("-"). The client controls it, so it is bounded:
               - length and alphabet: up to 64 of [A-Za-z0-9._:-] kept as sent, anything
                 else replaced by `h:` + 16 hex digits of its BLAKE2b digest;
               - cardinality: a key has at most `max_per_key` sessions active (seen in
                 the last `idle_sec`); a new one past that is accounted as `~other`, so a
                 client inventing an id per request adds one ledger row, not thousands.
    spend    per (key, label, calendar period id): tokens and cost (nano-units), added
             when a request ends (the ledger's figures), kept per process for the
             current periods only.
    cap      a key's `session_budget` (tokens and/or cost per day, week, month or total):
             a request of a session at or past it is refused before admission, 429
             `session_budget_exceeded`, with a message naming the session, what it spent
             of what, and when it resets. Requests without a session are never capped
             (and `~other` is not one session: it is not capped either).

Per process: with several replicas (or `--workers N`) each counts the requests it
served. Pure but for the injected clock.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from app.billing.budget_rules import Budget
from app.billing.periods import Calendar
from app.billing.prices import render
from app.errors import SessionBudgetExceeded
from app.kinds import BudgetPeriod

NONE = "-"  # a request without a session
OTHER = "~other"  # sessions of a key past its cap of active sessions
MAX_LABEL = 64
_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_BODY_FIELD = "prompt_cache_key"
# Request headers naming an agent session, in the order they are preferred.
HEADERS = (
    b"x-claude-code-session-id",
    b"session-id",
    b"session_id",
    b"thread-id",
    b"thread_id",
    b"x-session-id",
)


def clean(raw: str) -> str:
    """The label for a client-sent id: as sent if short and plain, else its digest."""
    raw = raw.strip()
    if _SAFE.fullmatch(raw):
        return raw
    return "h:" + hashlib.blake2b(raw.encode("utf-8", "replace"), digest_size=8).hexdigest()


def raw_session(header: str | None, body: dict[str, object]) -> str | None:
    if header:
        return header
    value = body.get(_BODY_FIELD)
    return value if isinstance(value, str) and value else None


@dataclass
class Spent:
    tokens: int = 0
    cost: int = 0  # nano-units of billing.currency
    requests: int = 0
    last: float = 0.0  # clock of the last request


class SessionBook:
    def __init__(
        self,
        calendar: Calendar,
        *,
        max_per_key: int = 64,
        idle_sec: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.calendar = calendar
        self.max_per_key = max_per_key
        self.idle_sec = idle_sec
        self.clock = clock
        self._active: dict[str, OrderedDict[str, float]] = {}  # key -> label -> last seen
        # (key, label, period id) -> spent; only ids of current periods are kept
        self._spent: dict[tuple[str, str, str], Spent] = {}
        self._today = ""

    # -- labels ---------------------------------------------------------------------------
    def label(self, key: str, raw: str | None) -> str:
        """The label a request of `key` is accounted under (bounded, see above)."""
        if not raw:
            return NONE
        label = clean(raw)
        now = self.clock()
        active = self._active.setdefault(key, OrderedDict())
        if label in active:
            active[label] = now
            active.move_to_end(label)
            return label
        while active and now - next(iter(active.values())) > self.idle_sec:
            active.popitem(last=False)
        if len(active) >= self.max_per_key:
            return OTHER
        active[label] = now
        return label

    # -- spend ------------------------------------------------------------------------------
    def add(
        self, key: str, label: str, tokens: int, cost: int | None, periods: Iterable[str]
    ) -> None:
        """A finished request of session `label`: its tokens and cost (None: unpriced)."""
        if label == NONE:
            return
        now = self.clock()
        today = self.calendar.window(BudgetPeriod.DAY, now).id
        if today != self._today:  # a new day: drop the spend of periods that ended
            self._today = today
            self.forget_past()
        for period in periods:
            spent = self._spent.get((key, label, period))
            if spent is None:
                spent = self._spent[(key, label, period)] = Spent()
            spent.tokens += tokens
            spent.cost += cost or 0
            spent.requests += 1
            spent.last = now

    def periods_now(self, budgets: Iterable[Budget]) -> list[str]:
        """The period ids a finished request counts in: those of the key's session
        budgets, and the day (the status page's view)."""
        now = self.clock()
        ids = {self.calendar.window(b.period, now).id for b in budgets}
        ids.add(self.calendar.window(BudgetPeriod.DAY, now).id)
        return sorted(ids)

    def over(
        self, key: str, label: str, budgets: Iterable[Budget]
    ) -> tuple[Budget, Spent, float | None] | None:
        """The first of `budgets` session `label` has used up: (budget, spent, reset)."""
        if label in (NONE, OTHER):
            return None
        now = self.clock()
        for budget in budgets:
            window = self.calendar.window(budget.period, now)
            spent = self._spent.get((key, label, window.id))
            if spent is None:
                continue
            used = spent.cost if budget.metric == "cost" else spent.tokens
            if used >= budget.limit:
                return budget, spent, window.end
        return None

    def costliest(self, n: int = 10) -> list[tuple[str, str, Spent]]:
        """Today's sessions, costliest first (tokens break ties): (key, label, spent)."""
        today = self.calendar.window(BudgetPeriod.DAY, self.clock()).id
        rows = [
            (spent, key, label)
            for (key, label, period), spent in self._spent.items()
            if period == today
        ]
        rows.sort(key=lambda r: (r[0].cost, r[0].tokens), reverse=True)
        return [(key, label, spent) for spent, key, label in rows[:n]]

    def forget_past(self) -> None:
        """Drop the spend of periods that ended (housekeeping, once a minute or so)."""
        now = self.clock()
        current = {self.calendar.window(p, now).id for p in BudgetPeriod}
        for k in [k for k in self._spent if k[2] not in current]:
            del self._spent[k]


def session_refusal(
    alias: str, label: str, over: tuple[Budget, Spent, float | None], currency: str
) -> SessionBudgetExceeded:
    """The 429 a capped session gets: written for the agent's user to read."""
    budget, spent, reset = over
    if budget.metric == "cost":
        used = f"{render(spent.cost)} {currency} of its {render(budget.limit)} {currency}"
    else:
        used = f"{spent.tokens} tokens of its {budget.limit}"
    when = (
        "never resets (a total)"
        if reset is None
        else "resets at " + datetime.fromtimestamp(reset, UTC).isoformat(timespec="seconds")
    )
    return SessionBudgetExceeded(
        f"This agent session ({label}) has used {used} per {budget.period} allowed for one "
        f"session of key '{alias}' (its session_budget); it {when}. Start a new session, or "
        "ask the gateway's admin to raise the key's session_budget.",
    )
