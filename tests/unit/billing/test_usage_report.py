"""Reports fold the ledger's UTC buckets into local periods, price them, and total them."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

from app.billing.periods import Calendar
from app.billing.usage_report import build

SHANGHAI = Calendar("Asia/Shanghai")


def row(period: datetime, key: str, **counts: int) -> dict[str, Any]:
    return {"period": int(period.timestamp()), "key": key, "requests": 1, **counts}


ROWS = [
    # 15:45 UTC is 23:45 in Shanghai (Nov 3); 16:00 UTC is midnight (Nov 4)
    row(datetime(2026, 11, 3, 15, 45, tzinfo=UTC), "alice", prompt_tokens=10, cost_nanos=500),
    row(datetime(2026, 11, 3, 16, 0, tzinfo=UTC), "alice", prompt_tokens=20, cost_nanos=700),
    row(datetime(2026, 11, 3, 16, 15, tzinfo=UTC), "bob", unpriced_requests=1),
    row(datetime(2026, 11, 3, 16, 30, tzinfo=UTC), "bob", estimated_requests=1, cost_nanos=3),
]


def test_days_are_local_days_and_totals_add_up() -> None:
    report = build(ROWS, group_by=["key"], granularity="day", calendar=SHANGHAI, currency="CNY")
    rows = report.rows()
    assert [(r["period"], r["key"], r["requests"]) for r in rows] == [
        ("2026-11-03T00:00:00+08:00", "alice", 1),
        ("2026-11-04T00:00:00+08:00", "alice", 1),
        ("2026-11-04T00:00:00+08:00", "bob", 2),
    ]
    assert rows[0]["cost"] == 0.0000005
    assert rows[2]["unpriced_requests"] == 1 and rows[2]["cost"] == 0.000000003
    assert rows[2]["estimated_share"] == 0.5
    totals = report.totals()
    assert totals["requests"] == 4 and totals["prompt_tokens"] == 30
    assert totals["cost"] == 0.000001203


def test_a_group_whose_every_request_is_unpriced_has_an_unknown_cost_never_zero() -> None:
    only = [row(datetime(2026, 11, 3, 16, 15, tzinfo=UTC), "bob", unpriced_requests=1)]
    report = build(only, group_by=["key"], granularity=None, calendar=SHANGHAI, currency="CNY")
    assert report.rows()[0]["cost"] is None
    lines = list(csv.reader(io.StringIO(report.csv())))
    assert lines[1][-2:] == ["unknown", "CNY"]


def test_csv_has_a_header_one_line_per_row_and_a_total_line() -> None:
    report = build(ROWS, group_by=["key"], granularity="hour", calendar=SHANGHAI, currency="CNY")
    lines = list(csv.DictReader(io.StringIO(report.csv())))
    assert [ln["period"] for ln in lines] == [
        "2026-11-03T23:00:00+08:00",
        "2026-11-04T00:00:00+08:00",
        "2026-11-04T00:00:00+08:00",
        "total",
    ]
    assert lines[-1]["requests"] == "4" and lines[-1]["cost"] == "0.000001203"
    assert lines[-1]["currency"] == "CNY"


def test_csv_cells_that_a_spreadsheet_would_evaluate_are_inert_and_every_cell_quoted() -> None:
    hostile = ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "plain-model", "-"]
    rows = [{"period": 0, "model": m, "requests": 1} for m in hostile]
    text = build(
        rows, group_by=["model"], granularity=None, calendar=SHANGHAI, currency="USD"
    ).csv()
    cells = [line[0] for line in csv.reader(io.StringIO(text))][1:-1]
    assert sorted(cells) == sorted(["'" + m for m in hostile[:-2]] + ["plain-model", "-"])
    assert all(line.startswith('"') for line in text.split("\n") if line)
