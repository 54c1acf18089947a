"""Calendar periods in a time zone: where each starts and resets, DST days included."""

from __future__ import annotations

from datetime import UTC, datetime

from app.billing.periods import Calendar
from app.kinds import BudgetPeriod


def at(*parts: int, tz: str = "UTC") -> float:
    from zoneinfo import ZoneInfo

    return datetime(*parts, tzinfo=ZoneInfo(tz)).timestamp()  # type: ignore[arg-type, misc]  # *parts is (y, m, d, h, ...)


def iso(cal: Calendar, t: float | None) -> str | None:
    return cal.describe(t)


def test_a_day_in_shanghai_starts_at_its_midnight_not_utcs() -> None:
    cal = Calendar("Asia/Shanghai")
    # 2026-11-02 17:30 UTC is 2026-11-03 01:30 in Shanghai
    w = cal.window(BudgetPeriod.DAY, datetime(2026, 11, 2, 17, 30, tzinfo=UTC).timestamp())
    assert w.id == "day:2026-11-03"
    assert iso(cal, w.start) == "2026-11-03T00:00:00+08:00"
    assert iso(cal, w.end) == "2026-11-04T00:00:00+08:00"
    assert w.start == datetime(2026, 11, 2, 16, tzinfo=UTC).timestamp()


def test_iso_weeks_start_on_monday_and_belong_to_their_iso_year() -> None:
    cal = Calendar("Asia/Shanghai")
    w = cal.window(BudgetPeriod.WEEK, at(2027, 1, 1, 12, tz="Asia/Shanghai"))  # a Friday
    assert w.id == "week:2026-W53"
    assert iso(cal, w.start) == "2026-12-28T00:00:00+08:00"  # Monday
    assert iso(cal, w.end) == "2027-01-04T00:00:00+08:00"


def test_months_reset_on_the_first_and_december_rolls_into_the_next_year() -> None:
    cal = Calendar("America/New_York")
    w = cal.window(BudgetPeriod.MONTH, at(2026, 12, 31, 23, 59, tz="America/New_York"))
    assert w.id == "month:2026-12"
    assert iso(cal, w.end) == "2027-01-01T00:00:00-05:00"
    assert (
        cal.window(BudgetPeriod.MONTH, w.end or 0).id == "month:2027-01"
    )  # the reset instant is in
    assert cal.window(BudgetPeriod.MONTH, (w.end or 0) - 0.001).id == "month:2026-12"


def test_dst_change_days_last_23_and_25_hours() -> None:
    cal = Calendar("Europe/Berlin")
    spring = cal.window(BudgetPeriod.DAY, at(2026, 3, 29, 12, tz="Europe/Berlin"))
    autumn = cal.window(BudgetPeriod.DAY, at(2026, 10, 25, 12, tz="Europe/Berlin"))
    assert ((spring.end or 0) - (spring.start or 0)) / 3600 == 23
    assert ((autumn.end or 0) - (autumn.start or 0)) / 3600 == 25
    assert iso(cal, autumn.end) == "2026-10-26T00:00:00+01:00"


def test_a_day_whose_midnight_does_not_exist_starts_at_its_first_instant() -> None:
    cal = Calendar("America/Sao_Paulo")  # 2018-11-04: clocks went from 00:00 to 01:00
    w = cal.window(BudgetPeriod.DAY, at(2018, 11, 4, 12, tz="America/Sao_Paulo"))
    assert iso(cal, w.start) == "2018-11-04T01:00:00-02:00"
    assert ((w.end or 0) - (w.start or 0)) / 3600 == 23


def test_total_never_resets_and_every_minute_has_the_ids_of_its_periods() -> None:
    cal = Calendar("Asia/Kolkata")  # +05:30
    w = cal.window(BudgetPeriod.TOTAL, 1e9)
    assert (w.id, w.start, w.end) == ("total", None, None)
    minute = int(datetime(2026, 11, 2, 18, 30, tzinfo=UTC).timestamp())  # 00:00 in Kolkata
    assert cal.ids_at(minute) == ("day:2026-11-03", "week:2026-W45", "month:2026-11", "total")
    assert cal.ids_at(minute - 60)[0] == "day:2026-11-02"
