"""What a reload changed, as audit entries: per key, team, price and window, secrets
never written, a key rotation seen as a changed fingerprint."""

from __future__ import annotations

from typing import Any

from app.config.audited import config_changes
from app.config.schema import Settings

A, B = "a" * 64, "b" * 64


def settings(**data: Any) -> Settings:
    return Settings.model_validate(data)


def test_keys_teams_prices_and_windows_are_compared_one_by_one() -> None:
    old = settings(
        keys=[{"alias": "alice", "key_sha256": A}, {"alias": "gone", "key_sha256": B}],
        billing={"prices": {"m": {"input": 1, "output": 2}}},
    )
    new = settings(
        keys=[
            {"alias": "alice", "key_sha256": A, "requests_per_minute": 5},
            {"alias": "bob", "key_sha256": B},
        ],
        billing={
            "prices": {"m": {"input": "0.5", "output": 2}},
            "windows": {"night": {"start": "00:30", "end": "08:30"}},
        },
        teams=[{"name": "ml", "budgets": [{"period": "day", "max_cost": 3}]}],
    )
    found = {(a, t): (b, c) for a, t, b, c in config_changes(old, new)}
    before, after = found[("key.changed", "key:alice")]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert (before["requests_per_minute"], after["requests_per_minute"]) == (None, 5)
    assert A not in str(found)  # a digest is never written
    assert ("key.added", "key:bob") in found and ("key.removed", "key:gone") in found
    price = found[("price.changed", "model:m")]
    assert price[0]["input"] == "1" and price[1]["input"] == "0.5"  # type: ignore[index]
    assert found[("window.added", "window:night")][1]["start"] == "00:30"  # type: ignore[index]
    assert found[("team.added", "team:ml")][0] is None


def test_a_rotation_shows_as_a_new_fingerprint_and_secrets_stay_secret() -> None:
    old = settings(keys=[{"alias": "k", "key_sha256": A}], admin_key="first-admin-secret-1")
    new = settings(keys=[{"alias": "k", "key_sha256": [A, B]}], admin_key="second-admin-secret")
    found = {(a, t): (b, c) for a, t, b, c in config_changes(old, new)}
    before, after = found[("key.changed", "key:k")]
    assert before["key_sha256"] != after["key_sha256"]  # type: ignore[index]
    assert found[("setting.changed", "admin_key")] == ("(secret)", "(secret)")
    assert "admin-secret" not in str(found)
    assert config_changes(new, new) == []
