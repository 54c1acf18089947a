"""What a reload (SIGHUP) changes, said setting by setting.

`Gateway.reload` applies a re-read configuration to the running process; a setting
it cannot change live (the listener, the log file, the stores, the upstream pools'
timeouts...) keeps its running value and is named as needing a restart instead of being
silently ignored. Which is which is declared once, in `app.config.effects`, and read
by both. With `--workers N` the supervisor replaces the workers one at a time, so every
change applies; it logs the same notes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from app.config.diff import changes
from app.config.effects import Effect, effect_of
from app.runtime import Runtime

log = logging.getLogger("tokengate.gateway")

_VERDICTS = {
    Effect.LIVE: "applied",
    Effect.RESTART: "restart needed",
    Effect.INERT: "no effect",  # informational, or deprecated and ignored
}


def describe_reload(
    old: Runtime, new: Runtime, *, now: datetime | None = None, replaced: bool = False
) -> list[str]:
    """The notes of a reload that need no running gateway: each changed setting, applied
    or needing a restart (`replaced`: the workers are replaced, so everything applies),
    and each key that is already expired."""
    notes = []
    for change in changes(old.settings, new.settings):
        effect = effect_of(change.path)
        if effect is Effect.PER_DOMAIN and not replaced:
            continue  # reported per domain by `Gateway.reload`, as the domain it changes
        if replaced and effect is not Effect.INERT:
            effect = Effect.LIVE  # a new worker reads every setting at its start
        notes.append(f"{_VERDICTS[effect]}: {change.shown()}")
    now = now or datetime.now(UTC)
    for key in new.keys:
        if key.expires_at is not None and key.expires_at <= now:
            notes.append(
                f"key {key.alias!r} expired at {key.expires_at.isoformat()}: "
                "it is refused with 401 expired_api_key"
            )
    return notes


def log_reload(notes: list[str]) -> None:
    """One line saying the reload happened, then one per note (a warning when it asks
    for something: a restart, a shadowing override, an expired key)."""
    log.warning("configuration reloaded: %d change(s) or note(s)", len(notes))
    for note in notes:
        quiet = note.startswith(("applied: ", "no effect: "))
        (log.info if quiet else log.warning)("reload: %s", note)
