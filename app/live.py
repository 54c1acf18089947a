"""What the admin API changes while the gateway runs: per-key limits, `max_concurrent` and
budgets.

Each change is written where every replica finds it first (the database for limits and
budgets, Redis for `max_concurrent`), then applied in this process; every other replica
reads it back in its once-a-second housekeeping (`load`), so a change made on one replica
is enforced by all within a second. A live value wins over the files until it is cleared
(docs/configuration.md, "Precedence").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.billing.books import BudgetOverride, BudgetOverrideBook, SpendBook
from app.billing.budget_rules import ZERO, Amount
from app.billing.ledger import Ledger
from app.billing.periods import Calendar
from app.billing.spend import OwnerView, SpendGate
from app.db.engine import DatabaseUnavailable
from app.db.overrides import OverrideBook
from app.errors import Conflict
from app.limits.admission import Admission
from app.limits.bucket import Limits
from app.limits.concurrency import ConcurrencyGate
from app.runtime import KeySpec, Runtime

log = logging.getLogger("tokengate.gateway")


class LiveControls:
    def __init__(
        self,
        runtime: Callable[[], Runtime],
        admission: Admission,
        gate: ConcurrencyGate,
        overrides: OverrideBook,
        budget_overrides: BudgetOverrideBook,
        spend: SpendGate,
        spend_book: SpendBook,
        ledger: Ledger,
        calendar: Calendar,
    ) -> None:
        self._runtime = runtime  # the gateway's current one (it changes on reload)
        self.admission = admission
        self.gate = gate
        self.overrides = overrides
        self.budget_overrides = budget_overrides
        self.spend = spend
        self.spend_book = spend_book
        self.ledger = ledger
        self.calendar = calendar

    # -- read back (start, and every second) --------------------------------------------
    async def load(self) -> None:
        await self.load_limits()
        await self.load_budget_overrides()

    async def load_limits(self) -> None:
        """Live limits set on any replica, enforced here within a second."""
        try:
            found = await self.overrides.load()
        except DatabaseUnavailable:
            return  # keep the ones we have; the database's state is in /health/ready
        except Exception as exc:
            log.error("reading live key limits failed: %r", exc)
            return
        # The whole table: an override cleared on another replica goes here too.
        self.admission.overrides = {
            alias: Limits(o.requests_per_minute, o.tokens_per_minute) for alias, o in found.items()
        }

    async def load_budget_overrides(self) -> None:
        """Budgets raised on any replica, applied here within a second."""
        try:
            self.spend.set_overrides(await self.budget_overrides.load(time.time()))
        except DatabaseUnavailable:
            return
        except Exception as exc:
            log.error("reading budget overrides failed: %r", exc)

    async def refresh_spend(self) -> None:
        """Every replica's settled spend of the current periods (after each flush)."""
        try:
            await self.spend.refresh(self.ledger, self.spend_book)
        except DatabaseUnavailable:
            return  # keep counting here; the database's state is in /health/ready
        except Exception as exc:
            log.error("reading budget spend failed: %r", exc)

    # -- per-key limits -----------------------------------------------------------------
    async def set_key_limits(self, key: KeySpec, rpm: int | None, tpm: int | None) -> Limits:
        """A live per-key limit: durable, enforced by every replica and worker within a
        second. It wins over the files until `clear_key_limits`."""
        current = self.admission.overrides.get(key.alias) or Limits(
            key.requests_per_minute, key.tokens_per_minute
        )
        limits = Limits(rpm or current.requests_per_minute, tpm or current.tokens_per_minute)
        await self.overrides.save(key.alias, limits.requests_per_minute, limits.tokens_per_minute)
        self.admission.overrides[key.alias] = limits
        log.warning("limits of key %s set live to %s", key.alias, limits)
        return limits

    async def clear_key_limits(self, key: KeySpec) -> bool:
        """Drop a key's live limits (rates and `max_concurrent`): they are the files'
        again, on every replica. Returns whether there was anything to clear."""
        cleared = self.admission.overrides.pop(key.alias, None)
        await self.overrides.delete(key.alias)
        cap = await self.gate.clear_cap(key.alias)
        if cap is not None:
            log.warning(
                "live max_concurrent of key %s cleared: back to the files' (%s)",
                key.alias,
                key.max_concurrent,
            )
        if cleared is not None:
            log.warning(
                "live limits of key %s cleared: back to the files' (%d requests/min, "
                "%d tokens/min)",
                key.alias,
                key.requests_per_minute,
                key.tokens_per_minute,
            )
        return cleared is not None or cap is not None

    def shadowing(self, keys: dict[str, KeySpec]) -> list[str]:
        """The live limits that hide what the files say for a key: a reload changes the
        files' values, and an override keeps winning until it is cleared."""
        notes = []
        for alias, live in sorted(self.admission.overrides.items()):
            key = keys.get(alias)
            if key is None:
                notes.append(f"live limits of {alias!r} kept for a key the files no longer have")
                continue
            files = Limits(key.requests_per_minute, key.tokens_per_minute)
            if files != live:
                notes.append(
                    f"key {alias!r}: the live limits set through the admin API "
                    f"(requests_per_minute={live.requests_per_minute}, "
                    f"tokens_per_minute={live.tokens_per_minute}) shadow the files' "
                    f"({files.requests_per_minute}, {files.tokens_per_minute}); "
                    f"DELETE /admin/keys/{alias}/limits returns to the files"
                )
        return notes

    async def set_key_concurrency(self, key: KeySpec, cap: int) -> int:
        """A live `max_concurrent`, shared with every replica through Redis."""
        if not self.gate.slots.shared and self._runtime().workers > 1:
            raise Conflict(
                "with --workers N and no Redis each worker counts its own slots, so a live "
                "max_concurrent would reach one worker only: set TOKENGATE_REDIS_URL, or edit "
                "settings.json and send SIGHUP",
                code="not_shared",
            )
        await self.gate.set_cap(key.alias, cap)
        log.warning("max_concurrent of key %s set live to %d", key.alias, cap)
        return cap

    # -- budgets ------------------------------------------------------------------------
    async def set_budget(self, override: BudgetOverride) -> None:
        """A temporary budget limit: durable, applied by every replica and worker within
        a second."""
        await self.budget_overrides.save(override)
        await self.load_budget_overrides()
        log.warning(
            "budget %s %s %s %s set live to %d until %s",
            override.scope,
            override.owner,
            override.period,
            override.metric,
            override.limit,
            self.calendar.describe(override.until),
        )

    async def end_budget(
        self, scope: str, owner: str, period: str | None, metric: str | None
    ) -> int:
        ended = await self.budget_overrides.end(scope, owner, period, metric)
        await self.load_budget_overrides()
        return ended

    async def budget_view(self) -> list[OwnerView]:
        """Every key's and team's spend of the current periods and its budgets: the
        durable spend of every replica plus this one's unflushed rows, read now."""
        runtime, now = self._runtime(), time.time()
        owners = [("key", k.alias) for k in runtime.keys]
        owners += [("team", t.name) for t in runtime.teams]
        ids = [w.id for w in self.spend.windows(now).values()]
        async with self.ledger.lock:
            durable = await self.spend_book.read(ids, owners)
            spent = self.ledger.unflushed_spend()
        for k, (cost, tokens) in durable.items():
            had = spent.get(k, ZERO)
            spent[k] = Amount(had.cost + cost, had.tokens + tokens)
        return self.spend.view(owners, spent, now)
