"""A reload names what changed, setting by setting, and never prints a secret."""

from __future__ import annotations

from pathlib import Path

from app.config.diff import changes
from app.config.schema import Settings
from app.config.sources import ConfigFiles, load_settings


def test_each_changed_field_is_named_with_its_values() -> None:
    old = Settings.model_validate({"token_scheduler": {"batch_size": 16}})
    new = Settings.model_validate(
        {"token_scheduler": {"batch_size": 8}, "logging": {"output": "/var/log/tg.log"}}
    )
    assert [c.shown() for c in changes(old, new)] == [
        "token_scheduler.batch_size 16 -> 8",
        "logging.output 'stderr' -> '/var/log/tg.log'",
    ]
    assert changes(old, old) == []


def test_settings_loaded_from_files_compare_field_by_field(tmp_path: Path) -> None:
    files = ConfigFiles(tmp_path / "config.toml", tmp_path / "settings.json")
    files.config.write_text("[token_scheduler]\nbatch_size = 16\n")
    files.settings.write_text("{}")
    old = load_settings(files, {})
    files.config.write_text("[token_scheduler]\nbatch_size = 8\n")
    new = load_settings(files, {})  # each load binds its own Settings subclass
    assert [c.shown() for c in changes(old, new)] == ["token_scheduler.batch_size 16 -> 8"]


def test_secrets_lists_and_mappings_are_reported_changed_never_shown() -> None:
    old = Settings.model_validate({"admin_key": "adm-old-secret-123", "keys": []})
    new = Settings.model_validate(
        {
            "admin_key": "adm-new-secret-456",
            "keys": [{"alias": "a", "key_sha256": "a" * 64}],
            "model_aliases": {"x": "y"},
            "redis": {"url": "redis://:pw-secret@r:6379/0"},
        }
    )
    shown = [c.shown() for c in changes(old, new)]
    assert shown == [
        "keys (changed)",
        "admin_key (changed)",
        "model_aliases (changed)",
        "redis.url (changed)",
    ]
    assert not any("secret" in line or "a" * 64 in line for line in shown)
