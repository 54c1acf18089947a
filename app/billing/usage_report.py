"""Usage reports: the ledger's sums by period and group, priced, with totals; JSON or CSV.

The ledger answers in UTC buckets of 15 minutes (`QUARTER`: every time zone's offset is
a multiple of it); reports fold them into the hours and days of `billing.timezone`, so
a daily report of a team in Shanghai starts its days at midnight in Shanghai. Hour rows
the ledger rolled up (older than `ledger.minute_retention_days`) count in the local
period their UTC hour starts in.

Cost: each row's `cost` is the sum over its priced requests in `billing.currency`;
`unpriced_requests` says how many of the row's requests had no price, and a row whose
every request is unpriced has `cost` null ("unknown"), never 0.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from app.billing.periods import Calendar
from app.billing.prices import amount, render

Granularity = Literal["hour", "day"]
QUARTER = 900  # seconds: the ledger's buckets asked for when folding into local periods
COUNTS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "failed_prompt_tokens",
    "failed_completion_tokens",
    "estimated_requests",
    "unpriced_requests",
)


@dataclass
class Line:
    period: float | None
    group: tuple[Any, ...]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    cost_nanos: int = 0

    def add(self, row: Mapping[str, Any]) -> None:
        for name in COUNTS:
            self.counts[name] += int(row.get(name) or 0)
        self.cost_nanos += int(row.get("cost_nanos") or 0)

    @property
    def cost_known(self) -> bool:
        return (
            not self.counts["requests"]
            or self.counts["unpriced_requests"] < self.counts["requests"]
        )


@dataclass
class Report:
    group_by: tuple[str, ...]
    granularity: Granularity | None
    currency: str
    calendar: Calendar
    lines: list[Line]
    total: Line

    def rows(self) -> list[dict[str, Any]]:
        return [self._row(line) for line in self.lines]

    def totals(self) -> dict[str, Any]:
        return self._row(self.total, grouped=False)

    def _row(self, line: Line, grouped: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.granularity is not None and grouped:
            out["period"] = self.calendar.describe(line.period)
        if grouped:
            out.update(zip(self.group_by, line.group, strict=True))
        out.update(line.counts)
        out["cost"] = amount(line.cost_nanos) if line.cost_known else None
        out["estimated_share"] = _share(line.counts["estimated_requests"], line.counts["requests"])
        return out

    def csv(self) -> str:
        """One line per row, then a `total` line; cost as an exact decimal. Every cell is
        quoted, and a text cell a spreadsheet would read as a formula is made inert."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL)
        lead = (["period"] if self.granularity else []) + list(self.group_by)
        writer.writerow([*lead, *COUNTS, "estimated_share", "cost", "currency"])
        for line in [*self.lines, self.total]:
            if line is self.total:
                head = ["total", *[""] * (len(lead) - 1)]
            else:
                when = self.calendar.describe(line.period) or ""
                head = [when] if self.granularity else []
                head += ["" if v is None else inert(str(v)) for v in line.group]
            share = _share(line.counts["estimated_requests"], line.counts["requests"])
            cost = render(line.cost_nanos) if line.cost_known else "unknown"
            writer.writerow([*head, *line.counts.values(), share, cost, self.currency])
        return buf.getvalue()


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(cell: str) -> str:
    """OWASP's CSV-injection defence: a cell starting with `=`, `+`, `-`, `@`, a tab or a
    carriage return gets a leading `'`, so a spreadsheet shows it as text instead of
    evaluating it (model names come from clients and upstreams). The ledger's own `-`
    ("no team", "no domain") stays as it is: alone it is no formula."""
    return f"'{cell}" if cell.startswith(_FORMULA_STARTS) and cell != "-" else cell


def build(
    rows: Iterable[Mapping[str, Any]],
    *,
    group_by: Sequence[str],
    granularity: Granularity | None,
    calendar: Calendar,
    currency: str,
) -> Report:
    """Fold the ledger's rows (with a `period` in UTC epoch seconds when `granularity` is
    set) into local periods and groups, in order, with their total."""
    lines: dict[tuple[Any, ...], Line] = {}
    total = Line(None, ())
    starts: dict[int, float] = {}
    for row in rows:
        period: float | None = None
        if granularity is not None:
            bucket = int(row["period"])
            period = starts.get(bucket)
            if period is None:
                period = starts[bucket] = _local_start(calendar, bucket, granularity)
        group = tuple(row[g] for g in group_by)
        line = lines.get((period, *group))
        if line is None:
            line = lines[(period, *group)] = Line(period, group)
        line.add(row)
        total.add(row)
    ordered = sorted(lines.values(), key=lambda ln: (ln.period or 0, [str(g) for g in ln.group]))
    return Report(tuple(group_by), granularity, currency, calendar, ordered, total)


def _local_start(calendar: Calendar, at: int, granularity: Granularity) -> float:
    if granularity == "day":
        return calendar.local_day_start(at)
    local = datetime.fromtimestamp(at, calendar.zone)
    return local.replace(minute=0, second=0, microsecond=0).timestamp()


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0
