"""What a reload (SIGHUP) changes, said setting by setting, and applying it.

`apply_reload` applies a re-read configuration to the parts a running process was built
from (`app.assembly`); a setting it cannot change live (the listener, the log file, the
stores, the upstream pools' timeouts...) keeps its running value and is named as needing a
restart instead of being silently ignored. Which is which is declared once, in
`app.config.effects`, and read by both the application and its report
(`describe_reload`). With `--workers N` the supervisor replaces the workers one at a time,
so every change applies; it logs the same notes.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime

from app.assembly import Parts, Spawn, configured_models, key_index, pace_state
from app.auth import KeyIndex
from app.billing.periods import Calendar
from app.config.diff import changes
from app.config.effects import Effect, effect_of, pin_restart
from app.config.schema import Settings
from app.dispatch.domain import Domain
from app.metrics import Metrics
from app.runtime import DomainSpec, Runtime

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
            continue  # reported per domain by `apply_reload`, as the domain it changes
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


@dataclasses.dataclass(frozen=True)
class Applied:
    """What the lifecycle owner holds from now on, and the notes naming every change."""

    runtime: Runtime
    keys: KeyIndex
    calendar: Calendar
    notes: list[str]


def apply_reload(
    parts: Parts, metrics: Metrics, running: Runtime, new: Runtime, spawn: Spawn
) -> Applied:
    """Apply a re-read configuration without dropping a request; name every change.

    Requests already admitted finish with the objects they hold; new ones see the new
    keys, limits, routes, aliases, retry policy, breaker thresholds, per-domain quotas,
    upstream keys and dispatcher settings (`Effect.LIVE` in `app.config.effects`). What
    a running process can not change (adding, removing or re-pointing a domain, the
    listener, log file, stores, timeouts of open pools...) keeps its running value and
    is named as needing a restart.
    """
    notes = describe_reload(running, new)
    # what only a restart applies keeps its running value (`app.config.effects`)
    new = dataclasses.replace(new, settings=pin_restart(running.settings, new.settings))
    spawn(parts.audit.reloaded(running, new))
    old = {d.name: d for d in parts.domains}
    new_specs = {d.name: d for d in new.domains}
    for name in sorted(set(old) ^ set(new_specs)):
        notes.append(f"restart needed: domain {name!r} added or removed")
    for name, domain in old.items():
        spec = new_specs.get(name)
        if spec is None:
            continue
        if spec.api_base != domain.spec.api_base:
            notes.append(f"restart needed: domain {name!r} api_base changed")
            spec = dataclasses.replace(spec, api_base=domain.spec.api_base)
        if spec.api_key.get_secret_value() != domain.spec.api_key.get_secret_value():
            notes.append(f"applied: domain {name!r} upstream key rotated")
        _retune(parts, domain, spec, new.settings)
    runtime = dataclasses.replace(new, domains=tuple(d.spec for d in parts.domains))
    keys = key_index(new)
    parts.pipeline.configure(runtime)
    parts.spend.configure(runtime)
    parts.alerts.configure(runtime)
    if new.settings.billing.timezone != parts.calendar.timezone:
        notes.append("billing.timezone changed: periods from now on are in the new zone")
        parts.calendar = Calendar(new.settings.billing.timezone)
        parts.ledger.calendar = parts.spend.calendar = parts.calendar
        parts.spend.windows_changed()
    metrics.add_models(configured_models(runtime))
    logging.getLogger("tokengate").setLevel(new.settings.logging.level.upper())
    notes += parts.live.shadowing(keys.by_alias)
    return Applied(runtime, keys, parts.calendar, notes)


def _retune(parts: Parts, domain: Domain, spec: DomainSpec, settings: Settings) -> None:
    sched = settings.token_scheduler
    domain.spec = spec
    domain.client.rekey(spec)
    domain.dispatcher.retune(
        group_size=sched.batch_size,
        group_window_ms=sched.batch_window_ms,
        queue_capacity=sched.queue_capacity,
        max_queue_wait_ms=sched.max_queue_wait_ms,
        max_inflight=spec.max_inflight,
        batch_share=settings.batch.share,
    )
    domain.breaker.cfg = settings.breaker  # thresholds; its window keeps its length
    domain.budget.ratio = settings.retry_policy.budget_ratio
    domain.budget.min_retries = settings.retry_policy.budget_min_retries
    state, fresh = domain.dispatcher.pacer.state, pace_state(spec, parts.divisor)
    if (fresh.configured, fresh.window) != (state.configured, state.window):
        domain.dispatcher.pacer = parts.store.pacer(spec.name, fresh)
