"""Every setting declares how a reload applies it, and the declaration is what runs."""

from __future__ import annotations

from app.config.effects import EFFECTS, Effect, effect_of, pin_restart, setting_paths
from app.config.schema import Settings


def test_every_setting_of_the_schema_declares_its_effect() -> None:
    paths = list(setting_paths())
    undeclared = [p for p in paths if p not in EFFECTS]
    assert not undeclared, f"declare these in app/config/effects.py: {undeclared}"
    assert not set(EFFECTS) - set(paths), "declared settings the schema no longer has"
    assert len(paths) > 100  # the walk reached into every section


def test_a_reload_keeps_the_running_value_of_what_needs_a_restart() -> None:
    old = Settings.model_validate({"token_scheduler": {"batch_size": 16, "timeout_ms": 30000}})
    new = Settings.model_validate(
        {
            "token_scheduler": {"batch_size": 8, "timeout_ms": 5000},
            "redis": {"url": "redis://r:6379/0"},
            "logging": {"level": "debug"},
        }
    )
    pinned = pin_restart(old, new)
    assert EFFECTS["token_scheduler.timeout_ms"] is Effect.RESTART
    assert (pinned.token_scheduler.batch_size, pinned.token_scheduler.timeout_ms) == (8, 30000)
    assert pinned.redis.url is None and pinned.logging.level == "debug"
    assert type(pinned) is type(new)


def test_a_part_of_a_declared_setting_takes_its_effect() -> None:
    assert effect_of("scale_up.max_inflight") is Effect.LIVE  # `[scale_up]` as one table
    assert effect_of("redis.url") is Effect.RESTART
    assert effect_of("no.such.setting") is Effect.RESTART
