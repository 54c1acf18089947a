"""Calendar periods of budgets and daily reports, in `billing.timezone`.

    day     from local midnight to the next one (23 or 25 hours on a DST change day)
    week    ISO week: from Monday's local midnight; id `week:2026-W45` (ISO year)
    month   from the 1st's local midnight; id `month:2026-11`
    total   never resets; id `total`

A period is named by its id (stable text: it keys the durable spend table and Redis),
and bounded by two instants (epoch seconds). Local midnight is resolved the way PEP 495
says with `fold=0`: where a DST change skips midnight (clocks go from 00:00 to 01:00),
the day starts at the first instant that exists, 01:00.

Every time zone's offset is a whole number of minutes, so every boundary falls on a
minute: the ledger's minute buckets are never split by one (`ids_at` is cached per
minute for the ledger's flush).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from app.kinds import BudgetPeriod

PERIODS: tuple[BudgetPeriod, ...] = tuple(BudgetPeriod)
_CACHED_MINUTES = 4096


class Span(NamedTuple):
    period: BudgetPeriod
    id: str
    start: float | None  # None for `total`
    end: float | None  # when it resets; None for `total`


class Calendar:
    def __init__(self, timezone: str = "UTC") -> None:
        self.timezone = timezone
        self.zone = ZoneInfo(timezone)
        self._ids: dict[int, tuple[str, ...]] = {}

    def window(self, period: BudgetPeriod, at: float) -> Span:
        if period == BudgetPeriod.TOTAL:
            return Span(period, "total", None, None)
        local = datetime.fromtimestamp(at, self.zone).date()
        if period == BudgetPeriod.DAY:
            first, after = local, local + timedelta(days=1)
            pid = f"day:{local.isoformat()}"
        elif period == BudgetPeriod.WEEK:
            first = local - timedelta(days=local.weekday())
            after = first + timedelta(days=7)
            year, week, _ = local.isocalendar()
            pid = f"week:{year}-W{week:02d}"
        else:
            first = local.replace(day=1)
            after = (first + timedelta(days=32)).replace(day=1)
            pid = f"month:{first.year}-{first.month:02d}"
        return Span(period, pid, self.midnight(first), self.midnight(after))

    def midnight(self, day: date) -> float:
        """The first instant of `day` here (epoch seconds)."""
        return datetime(day.year, day.month, day.day, tzinfo=self.zone).timestamp()

    def windows(self, at: float) -> tuple[Span, ...]:
        return tuple(self.window(p, at) for p in PERIODS)

    def ids_at(self, minute: int) -> tuple[str, ...]:
        """The ids of every period holding this minute bucket (epoch s, a multiple of 60),
        in `PERIODS` order; cached, since a flush asks for the same few minutes."""
        found = self._ids.get(minute)
        if found is None:
            if len(self._ids) >= _CACHED_MINUTES:
                self._ids.clear()
            found = self._ids[minute] = tuple(w.id for w in self.windows(minute))
        return found

    def local_day_start(self, at: float) -> float:
        """Start of the local day holding `at` (daily reports)."""
        return self.midnight(datetime.fromtimestamp(at, self.zone).date())

    def describe(self, at: float | None) -> str | None:
        """ISO 8601 with this zone's offset (`2026-12-01T00:00:00+08:00`)."""
        if at is None:
            return None
        return datetime.fromtimestamp(at, self.zone).isoformat()
