"""Billing windows on the local wall clock: midnight crossing, week wrap, DST both ways,
and `next_change` checked minute by minute against `at`."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from app.billing.prices import PriceList, Tokens
from app.billing.timetable import NO_WINDOW, Timetable
from app.config.billing import BillingConfig, PriceConfig, WindowConfig

UTC = "UTC"


def local(*parts: int, tz: str, fold: int = 0) -> float:
    return datetime(*parts, tzinfo=ZoneInfo(tz), fold=fold).timestamp()  # type: ignore[arg-type, misc]  # *parts is (y, m, d, h, ...)


def table(tz: str = UTC, **windows: dict[str, object]) -> Timetable:
    return Timetable({n: WindowConfig.model_validate(w) for n, w in windows.items()}, tz)


def test_a_daily_window_holds_from_its_start_to_just_before_its_end() -> None:
    t = table(offpeak={"start": "16:30", "end": "23:00"})
    assert t.at(local(2026, 12, 5, 16, 29, 59, tz=UTC)) is None
    assert t.at(local(2026, 12, 5, 16, 30, tz=UTC)) == "offpeak"
    assert t.at(local(2026, 12, 5, 22, 59, 59, tz=UTC)) == "offpeak"
    assert t.at(local(2026, 12, 5, 23, 0, tz=UTC)) is None


def test_a_window_crossing_midnight_belongs_to_the_day_it_starts_on() -> None:
    t = table(late={"days": ["fri"], "start": "22:00", "end": "02:00"})
    # 2026-12-04 is a Friday
    assert t.at(local(2026, 12, 4, 21, 59, tz=UTC)) is None
    assert t.at(local(2026, 12, 4, 22, 0, tz=UTC)) == "late"
    assert t.at(local(2026, 12, 5, 1, 59, tz=UTC)) == "late"  # Saturday morning
    assert t.at(local(2026, 12, 5, 2, 0, tz=UTC)) is None
    assert t.at(local(2026, 12, 5, 22, 30, tz=UTC)) is None  # Saturday night: not its day
    assert t.at(local(2026, 12, 4, 1, 0, tz=UTC)) is None  # Thursday's night: not its day


def test_sunday_night_wraps_into_monday_morning() -> None:
    t = table(late={"days": ["sun"], "start": "23:00", "end": "01:00"})
    assert t.at(local(2026, 12, 6, 23, 30, tz=UTC)) == "late"  # Sunday
    assert t.at(local(2026, 12, 7, 0, 59, tz=UTC)) == "late"  # Monday
    assert t.at(local(2026, 12, 7, 1, 0, tz=UTC)) is None
    change = t.next_change(local(2026, 12, 7, 0, 10, tz=UTC))
    assert change is not None and change.at == local(2026, 12, 7, 1, 0, tz=UTC)


def test_equal_start_and_end_is_24_hours_and_24_00_ends_at_midnight() -> None:
    t = table(
        weekend={"days": ["sat"], "start": "00:00", "end": "00:00"},
        evening={"days": ["fri"], "start": "18:00", "end": "24:00"},
    )
    assert t.at(local(2026, 12, 5, 0, 0, tz=UTC)) == "weekend"
    assert t.at(local(2026, 12, 5, 23, 59, tz=UTC)) == "weekend"
    assert t.at(local(2026, 12, 4, 23, 59, tz=UTC)) == "evening"
    change = t.next_change(local(2026, 12, 4, 19, 0, tz=UTC))
    # evening ends where weekend begins: one change, straight from one to the other
    assert change == (local(2026, 12, 5, 0, 0, tz=UTC), "weekend")


def test_windows_are_read_in_the_billing_time_zone() -> None:
    t = table("Asia/Shanghai", offpeak={"start": "00:30", "end": "08:30"})
    # 00:30-08:30 Beijing is 16:30-00:30 UTC (DeepSeek's discount hours)
    assert t.at(local(2026, 12, 5, 16, 30, tz=UTC)) == "offpeak"
    assert t.at(local(2026, 12, 6, 0, 29, tz=UTC)) == "offpeak"
    assert t.at(local(2026, 12, 6, 0, 30, tz=UTC)) is None
    assert t.at(local(2026, 12, 5, 16, 29, tz=UTC)) is None


def test_spring_forward_a_window_ending_in_the_skipped_hour_ends_when_it_is_skipped() -> None:
    berlin = "Europe/Berlin"  # 2026-03-29 02:00 CET -> 03:00 CEST
    t = table(berlin, night={"start": "01:00", "end": "02:30"})
    inside = local(2026, 3, 29, 1, 45, tz=berlin)
    assert t.at(inside) == "night"
    change = t.next_change(inside)
    assert change is not None
    assert t.describe(change.at) == "2026-03-29T03:00:00+02:00"
    assert change.window is None


def test_spring_forward_a_window_starting_in_the_skipped_hour_starts_after_it() -> None:
    ny = "America/New_York"  # 2026-03-08 02:00 EST -> 03:00 EDT
    t = table(ny, early={"start": "02:30", "end": "04:00"})
    change = t.next_change(local(2026, 3, 8, 1, 0, tz=ny))
    assert change is not None
    assert t.describe(change.at) == "2026-03-08T03:00:00-04:00"
    assert change.window == "early"
    ends = t.next_change(change.at)
    assert ends is not None and t.describe(ends.at) == "2026-03-08T04:00:00-04:00"


def test_fall_back_the_repeated_hour_is_in_the_window_both_times() -> None:
    berlin = "Europe/Berlin"  # 2026-10-25 03:00 CEST -> 02:00 CET
    t = table(berlin, short={"start": "02:00", "end": "02:30"})
    first = local(2026, 10, 25, 2, 10, tz=berlin, fold=0)
    second = local(2026, 10, 25, 2, 10, tz=berlin, fold=1)
    assert second - first == 3600
    assert t.at(first) == t.at(second) == "short"
    out = t.next_change(first)
    assert out is not None and t.describe(out.at) == "2026-10-25T02:30:00+02:00"
    back = t.next_change(out.at)
    assert back is not None and back.window == "short"
    assert t.describe(back.at) == "2026-10-25T02:00:00+01:00"  # the clock went back into it
    out_again = t.next_change(back.at)
    assert out_again is not None and t.describe(out_again.at) == "2026-10-25T02:30:00+01:00"


@pytest.mark.parametrize(
    ("tz", "start"),
    [
        ("Europe/Berlin", (2026, 3, 27)),
        ("Europe/Berlin", (2026, 10, 23)),
        ("America/New_York", (2026, 3, 6)),
        ("America/New_York", (2026, 10, 30)),
        ("Australia/Lord_Howe", (2026, 4, 3)),  # a 30-minute DST change
        ("Asia/Shanghai", (2026, 12, 4)),
    ],
)
def test_next_change_is_the_first_minute_at_answers_otherwise(
    tz: str, start: tuple[int, int, int]
) -> None:
    t = table(
        tz,
        peak={"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", "end": "12:00"},
        peak2={"days": ["mon", "tue", "wed", "thu", "fri"], "start": "14:00", "end": "18:00"},
        night={"start": "01:30", "end": "02:30"},
        weekend={"days": ["sat"], "start": "22:00", "end": "07:00"},
    )
    first = local(*start, 0, 0, tz=tz)
    minutes = [first + 60 * m for m in range(4 * 1440)]
    answers = [t.at(m) for m in minutes]
    for i in range(0, len(minutes) - 1440, 7):
        change = t.next_change(minutes[i] + 13)  # mid-minute
        expected = next((j for j in range(i + 1, len(minutes)) if answers[j] != answers[i]), None)
        assert change is not None and expected is not None
        assert change.at == minutes[expected], (tz, t.describe(minutes[i]))
        assert change.window == answers[expected]


def test_name_at_follows_the_stretches_and_a_clock_going_back() -> None:
    t = table(offpeak={"start": "16:30", "end": "00:30"})
    assert t.name_at(local(2026, 12, 5, 16, 29, 59, tz=UTC)) == NO_WINDOW
    assert t.name_at(local(2026, 12, 5, 16, 30, tz=UTC)) == "offpeak"
    assert t.name_at(local(2026, 12, 6, 0, 29, tz=UTC)) == "offpeak"
    assert t.name_at(local(2026, 12, 6, 0, 30, tz=UTC)) == NO_WINDOW
    assert t.name_at(local(2026, 12, 5, 17, 0, tz=UTC)) == "offpeak"  # back in time


def test_no_windows_and_a_window_all_week_never_change() -> None:
    assert not Timetable({}, UTC)
    assert Timetable({}, UTC).name_at(0) == NO_WINDOW
    always = table(all={"start": "00:00", "end": "00:00"})
    assert always.next_change(0) is None
    assert always.name_at(0) == "all"


def test_overlapping_windows_and_unknown_window_prices_are_refused() -> None:
    with pytest.raises(ValidationError, match="overlap"):
        BillingConfig.model_validate(
            {
                "windows": {
                    "a": {"days": ["fri"], "start": "22:00", "end": "02:00"},
                    "b": {"days": ["sat"], "start": "01:00", "end": "03:00"},
                }
            }
        )
    with pytest.raises(ValidationError, match="overlap"):  # Sunday night into Monday
        BillingConfig.model_validate(
            {
                "windows": {
                    "a": {"days": ["sun"], "start": "23:00", "end": "01:00"},
                    "b": {"days": ["mon"], "start": "00:30", "end": "03:00"},
                }
            }
        )
    with pytest.raises(ValidationError, match="does not define"):
        BillingConfig.model_validate(
            {"prices": {"m": {"input": 1, "output": 2, "windows": {"offpeak": {"input": 0.5}}}}}
        )
    for bad in ("25:00", "9:00", "24:30", "12:60"):
        with pytest.raises(ValidationError):
            WindowConfig.model_validate({"start": bad, "end": "10:00"})
    with pytest.raises(ValidationError):
        WindowConfig.model_validate({"days": ["monday"], "start": "01:00", "end": "02:00"})


def test_a_model_is_priced_by_the_window_with_what_the_window_leaves_out_its_own() -> None:
    cfg = PriceConfig.model_validate(
        {
            "input": 0.27,
            "output": 1.10,
            "cached_input": 0.07,
            "windows": {"offpeak": {"input": 0.135, "output": 0.55}, "peak": {"output": 2.2}},
        }
    )
    prices = PriceList({"deepseek-chat": cfg})
    off = prices.price("deepseek-chat", window="offpeak")
    assert off is not None
    assert (off.input, off.output, off.cached_input) == (
        Decimal("0.135"),
        Decimal("0.55"),
        Decimal("0.07"),
    )
    assert off.cache_write == Decimal("0.135")  # unset everywhere: the window's input
    tokens = Tokens(prompt=1_000_000, completion=1_000_000)
    assert prices.cost(tokens, "deepseek-chat") == 1_370_000_000
    assert prices.cost(tokens, "deepseek-chat", window="offpeak") == 685_000_000
    assert prices.cost(tokens, "deepseek-chat", window="peak") == 2_470_000_000
    assert prices.cost(tokens, "deepseek-chat", window=NO_WINDOW) == 1_370_000_000
    assert prices.cost(tokens, "other", window="offpeak") is None
