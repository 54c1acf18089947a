"""What a reload (SIGHUP) changes, said setting by setting.

`Gateway.reload` applies a re-read configuration to the running process; a setting
it cannot change live (the listener, the log file, the stores, the upstream pools'
timeouts...) is named as needing a restart instead of being silently ignored. With
`--workers N` the supervisor replaces the workers one at a time, so every change
applies; it logs the same notes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from app.config.diff import changes
from app.runtime import Runtime

log = logging.getLogger("tokengate.gateway")

# What `Gateway.reload` applies to a running process, as prefixes of `app.config.diff`
# paths; every other change is named as needing a restart. `scale_up` is judged domain
# by domain (adding, removing or re-pointing one needs a restart; its limits, models,
# key and in-flight cap apply), and so are the URLs that re-point domains.
LIVE = (
    "cluster",
    "scale_out",
    "scale_up",
    "token_scheduler.api_key_env",
    "token_scheduler.max_retries",
    "token_scheduler.batch_size",
    "token_scheduler.batch_window_ms",
    "token_scheduler.queue_capacity",
    "token_scheduler.max_queue_wait_ms",
    "token_scheduler.max_inflight",
    "logging.level",
    "logging.log_prompts",
    "api_key",
    "model_route",
    "rate_limit",
    "retry_policy.max_attempts",
    "retry_policy.backoff_ms",
    "retry_policy.max_backoff_ms",
    "retry_policy.max_retry_after_ms",
    "retry_policy.budget_ratio",
    "retry_policy.budget_min_retries",
    "retry_policy.client_retries",
    "health_check.interval_sec",
    "health_check.endpoint",
    "health_check.timeout_ms",
    "breaker.failure_threshold",
    "breaker.failure_rate",
    "breaker.min_requests",
    "breaker.open_sec",
    "keys",
    "admin_key",
    "metrics.token",
    "model_aliases",
    "server.max_body_bytes",
    "server.websocket_idle_timeout_sec",
    "server.max_websockets_per_key",
    "batch.share",
    "billing.prices",  # the pipeline's price list and billing windows are rebuilt
    "billing.windows",
    "token_scheduler.flex_max_queue_wait_ms",
    "audit.retention_days",  # read at each audit upkeep
)
_PER_DOMAIN = ("api_endpoint", "token_scheduler.api_base")


def _live(path: str) -> bool:
    return any(path == p or path.startswith(f"{p}.") for p in LIVE)


def describe_reload(
    old: Runtime, new: Runtime, *, now: datetime | None = None, replaced: bool = False
) -> list[str]:
    """The notes of a reload that need no running gateway: each changed setting, applied
    or needing a restart (`replaced`: the workers are replaced, so everything applies),
    and each key that is already expired."""
    notes = []
    for change in changes(old.settings, new.settings):
        if change.path in _PER_DOMAIN and not replaced:
            continue  # reported per domain, as the api_base it changes
        verdict = "applied" if replaced or _live(change.path) else "restart needed"
        notes.append(f"{verdict}: {change.shown()}")
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
        (log.info if note.startswith("applied: ") else log.warning)("reload: %s", note)
