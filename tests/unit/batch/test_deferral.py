"""Holding batches for an off-peak window: held while it is not in force, released in
it, released early when waiting would miss the completion window; each once."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.batch.deferral import DeferDecision, decide, defer_window, note
from app.billing.timetable import Timetable
from app.config.billing import WindowConfig
from app.config.schema import Settings

T = Timetable({"offpeak": WindowConfig(start="16:30", end="00:30")}, "UTC")
NOON = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
EVENING = datetime(2026, 12, 5, 17, 0, tzinfo=UTC).timestamp()
DAY = 86400.0


def test_held_until_the_window_released_in_it_and_early_when_it_would_miss() -> None:
    held = decide(T, "offpeak", NOON, NOON + DAY, 100, 2.0, 10, 3600)
    assert held.hold and held.release_at == datetime(2026, 12, 5, 16, 30, tzinfo=UTC).timestamp()
    assert decide(T, "offpeak", EVENING, EVENING + DAY, 100, 2.0, 10, 3600) == DeferDecision(
        False, "offpeak", None
    )
    # 4.5 h to the window, 10,000 items at 2 s over 10 slots (2000 s) + 1 h: 5 h is too late
    early = decide(T, "offpeak", NOON, NOON + 5 * 3600, 10_000, 2.0, 10, 3600)
    assert not early.hold and early.early
    assert not decide(T, None, NOON, NOON + DAY, 1, 2.0, 10, 0).hold


def test_the_batch_carries_the_decision_and_each_change_is_noted_once() -> None:
    batch: dict[str, object] = {"id": "b"}
    held = decide(T, "offpeak", NOON, NOON + DAY, 5, 2.0, 10, 3600)
    assert note(batch, held, NOON) is True
    assert note(batch, held, NOON + 10) is False  # still held: nothing new
    info = batch["tokengate_deferral"]
    assert isinstance(info, dict)
    assert info["release_at"] == "2026-12-05T16:30:00+00:00" and info["released_at"] is None
    released = decide(T, "offpeak", EVENING, EVENING + DAY, 5, 2.0, 10, 3600)
    assert note(batch, released, EVENING) is True
    assert info["released_at"] == int(EVENING) and info["early"] is False
    assert note(batch, released, EVENING + 5) is False
    fresh: dict[str, object] = {"id": "c"}
    assert note(fresh, released, EVENING) is False  # in the window at once: never held
    rushed: dict[str, object] = {"id": "d"}
    early = decide(T, "offpeak", NOON, NOON + 3600, 5, 2.0, 10, 3600)
    assert note(rushed, early, NOON) is True
    assert rushed["tokengate_deferral"]["early"] is True  # type: ignore[index]


def test_the_window_defaults_to_offpeak_when_there_is_one() -> None:
    windows = {"offpeak": {"start": "16:30", "end": "00:30"}}
    assert defer_window(Settings.model_validate({"billing": {"windows": windows}})) == "offpeak"
    assert defer_window(Settings.model_validate({})) is None
    none = {"billing": {"windows": windows}, "batch": {"defer_window": None}}
    assert defer_window(Settings.model_validate(none)) is None
    night = {
        "billing": {"windows": {"night": windows["offpeak"]}},
        "batch": {"defer_window": "night"},
    }
    assert defer_window(Settings.model_validate(night)) == "night"


def test_a_key_may_choose_its_own_window_or_idle_quota() -> None:
    windows = {
        "offpeak": {"start": "16:30", "end": "00:30"},
        "night": {"start": "01:00", "end": "05:00"},
    }
    settings = Settings.model_validate({"billing": {"windows": windows}})
    assert defer_window(settings, "night") == "night"
    assert defer_window(settings, "none") is None  # idle upstream quota: at once
    assert defer_window(settings, None) == "offpeak"  # batch.defer_window (auto)


def test_a_domain_may_choose_for_the_work_it_serves_and_a_key_overrides_it() -> None:
    windows = {
        "offpeak": {"start": "16:30", "end": "00:30"},
        "night": {"start": "01:00", "end": "05:00"},
    }
    domains = [
        {"domain": "gpu-a", "api_base": "http://a", "defer_window": "night"},
        {"domain": "gpu-b", "api_base": "http://b", "defer_window": "none"},
        {"domain": "gpu-c", "api_base": "http://c"},
    ]
    settings = Settings.model_validate({"billing": {"windows": windows}, "scale_up": domains})
    assert defer_window(settings, None, "gpu-a") == "night"
    assert defer_window(settings, None, "gpu-b") is None  # idle quota
    assert defer_window(settings, None, "gpu-c") == "offpeak"  # unset: batch.defer_window
    assert defer_window(settings, None, None) == "offpeak"  # several domains, none named
    assert defer_window(settings, "offpeak", "gpu-b") == "offpeak"  # the key's word wins
    one = Settings.model_validate(
        {
            "billing": {"windows": windows},
            "scale_up": {"api_base": "http://a", **{"defer_window": "night"}},
        }
    )
    assert defer_window(one, None, None) == "night"  # one domain: its choice for all


def test_a_domain_naming_an_unknown_window_is_refused_at_start() -> None:
    from app.config.problems import ConfigError
    from app.runtime import compile_runtime

    settings = Settings.model_validate(
        {
            "billing": {"windows": {"offpeak": {"start": "16:30", "end": "00:30"}}},
            "scale_up": {"api_base": "http://a", "defer_window": "nightt"},
        }
    )
    with pytest.raises(ConfigError) as refused:
        compile_runtime(settings, {"TAOTOKEN_API_KEY": "sk-x"})
    assert "scale_up[0].defer_window" in refused.value.render()
    assert "no billing window 'nightt'" in refused.value.render()
