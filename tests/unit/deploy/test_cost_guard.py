"""The cost guard's verdicts and its budget file (tests/bench/guard.py, budgets.toml).

The measuring itself (callgrind over a real gateway) runs in `make cost-guard`; these
check what CI decides from the figures and how a re-baseline rewrites the file.
"""

from __future__ import annotations

import pytest

from tests.bench import guard

TEXT = """# budgets
#
# -- history (newest last): date, what changed the budgets and why
# 2026-01-01: first baseline (chat_json 1,000,000)

[budgets]
chat_json = 1000000
chat_stream = 2000000
"""


def test_the_shipped_budgets_cover_every_scenario() -> None:
    budgets = guard.load_budgets(guard.BUDGETS.read_text())
    expected = {
        "chat_json",
        "chat_stream",
        "chat_stream_event",
        "chat_json_redis",
        "chat_json_info",
    }
    assert expected | {"responses_stream"} == set(budgets)
    assert all(v > 0 for v in budgets.values())


def test_the_compiled_build_has_budgets_of_its_own_and_they_are_lower() -> None:
    """`make cost-guard` counts the image's build too: the same scenarios, each cheaper
    compiled than interpreted (else compiling bought nothing there)."""
    source = guard.load_budgets(guard.BUDGETS.read_text())
    compiled = guard.load_budgets((guard.BUDGETS.parent / "budgets_compiled.toml").read_text())
    assert set(compiled) == set(source)
    assert all(compiled[name] < source[name] for name in source)


def test_over_budget_by_more_than_the_tolerance_fails_and_within_passes() -> None:
    budgets = guard.load_budgets(TEXT)
    verdicts = dict(guard.verdicts(budgets, {"chat_json": 1_031_000, "chat_stream": 2_059_000}))
    assert verdicts == {"chat_json": "over", "chat_stream": "ok"}


def test_a_speed_up_is_flagged_so_the_budget_is_lowered() -> None:
    budgets = guard.load_budgets(TEXT)
    verdicts = dict(guard.verdicts(budgets, {"chat_json": 900_000, "chat_stream": 2_000_000}))
    assert verdicts["chat_json"] == "under"


def test_a_scenario_without_a_measure_or_a_budget_is_reported() -> None:
    verdicts = dict(guard.verdicts({"gone": 1}, {"fresh": 2.0}))
    assert verdicts == {"gone": "missing", "fresh": "new"}


def test_raising_a_budget_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="chat_json"):
        guard.updated(TEXT, {"chat_json": 1_100_000}, "", "2026-02-01")


def test_an_update_rewrites_the_values_and_appends_one_history_line() -> None:
    out = guard.updated(
        TEXT, {"chat_json": 900_000.4, "chat_stream": 2_000_000, "new_one": 5}, "", "2026-02-01"
    )
    assert guard.load_budgets(out) == {"chat_json": 900_000, "chat_stream": 2_000_000, "new_one": 5}
    history = [line for line in out.splitlines() if line.startswith("# 2026-")]
    assert history == [
        "# 2026-01-01: first baseline (chat_json 1,000,000)",
        "# 2026-02-01: lowered to what was measured (chat_json 1,000,000 -> 900,000, new_one 5)",
    ]
    assert out.startswith("# budgets\n")


def test_a_raise_with_a_reason_says_what_bought_it() -> None:
    out = guard.updated(TEXT, {"chat_stream": 2_100_000}, "budget checks on streams", "2026-02-01")
    assert "# 2026-02-01: budget checks on streams (chat_stream 2,000,000 -> 2,100,000)" in out
    assert guard.load_budgets(out)["chat_stream"] == 2_100_000


def test_the_lowest_two_rounds_that_agree_are_the_figure() -> None:
    rounds = iter([1_900_000.0, 1_085_000.0, 1_078_000.0])
    figure = guard.until_agreed(lambda: next(rounds), max_rounds=4)
    assert figure.rounds == [1_900_000.0, 1_085_000.0, 1_078_000.0]
    assert figure.value == pytest.approx(1_081_500)
    assert figure.spread < guard.AGREE


def test_the_upstream_streams_count_every_content_event_once() -> None:
    events = guard.chat_events(36)
    body = b"".join(events)
    assert body.count(guard.TOKEN.encode()) == 36
    assert b"".join(guard.responses_events(4)).count(guard.TOKEN.encode()) == 4
