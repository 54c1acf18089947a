"""Every setting declares how a reload applies it, and the declaration is what runs."""

from __future__ import annotations

from app.config.effects import EFFECTS, Effect, effect_of, pin_restart, setting_paths
from app.config.schema import Settings
from tests.support.changed_settings import NEW, nest


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


def _at(settings: Settings, path: str) -> object:
    value: object = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_setting_runs_on_the_value_its_declaration_says() -> None:
    """Every setting changed at once: the running settings hold the new value of what is
    live (or inert) and the old value of what waits for a restart."""
    old = Settings.model_validate({})
    flat = {path: value for path, value in NEW.items() if value is not None}
    new = Settings.model_validate(nest(flat))
    running = pin_restart(old, new)
    for path in flat:
        expected = _at(old, path) if EFFECTS[path] is Effect.RESTART else _at(new, path)
        assert _at(running, path) == expected, path
