"""How each setting takes effect on a reload (SIGHUP): the one declaration.

Both sides of a reload read this table: `app.reload.apply_reload` runs on the new value of every
`LIVE` setting and keeps the running value of every `RESTART` one (`pin_restart`), and
the report (`app.reload.describe_reload`) names each change by the same verdict. So the
report cannot say "applied" for a value the process does not run on, nor "restart
needed" for one it does. A setting missing here fails a unit test, so a new one cannot
be forgotten.

Paths are those of `app.config.diff`: sections field by field, lists, mappings and the
`scale_up` table or array as one value each.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from enum import StrEnum
from types import MappingProxyType

from pydantic import BaseModel

from app.config.diff import changes
from app.config.schema import Settings


class Effect(StrEnum):
    LIVE = "live"  # the running process takes the new value
    RESTART = "restart"  # read once at start: the running value stays until a restart
    PER_DOMAIN = "per domain"  # re-points domains: `apply_reload` judges each domain
    INERT = "inert"  # read by nothing: informational, or deprecated and ignored


L, R, D, N = Effect.LIVE, Effect.RESTART, Effect.PER_DOMAIN, Effect.INERT

EFFECTS: Mapping[str, Effect] = MappingProxyType(
    {
        "cluster.name": L,  # alert webhook bodies
        # names the one domain of a `[scale_up]` table: a domain renamed is added/removed
        "cluster.scale_up_domain": D,
        "cluster.node_count": N,
        "cluster.gpu_per_node": N,
        "cluster.total_gpus": N,
        "token_scheduler.api_base": D,
        "token_scheduler.api_key_env": L,  # the upstream key, re-read from the environment
        "token_scheduler.timeout_ms": R,  # the upstream pools' timeouts
        "token_scheduler.connect_timeout_ms": R,
        "token_scheduler.max_retries": L,
        "token_scheduler.batch_size": L,
        "token_scheduler.batch_window_ms": L,
        "token_scheduler.queue_capacity": L,
        "token_scheduler.max_queue_wait_ms": L,
        "token_scheduler.flex_max_queue_wait_ms": L,
        "token_scheduler.max_inflight": L,
        # Each domain's limits, models, key and in-flight cap apply; adding, removing or
        # re-pointing a domain is named by `apply_reload` as needing a restart.
        "scale_up": L,
        "scale_out.enabled": N,
        "scale_out.protocol": N,
        "scale_out.fallback": N,
        "logging.level": L,
        "logging.output": R,
        "logging.log_prompts": N,  # deprecated: prompts are never logged
        "api_endpoint": D,
        "api_key": L,
        "model_route.default": L,
        "model_route.fallback": L,
        "rate_limit.tokens_per_minute": L,
        "rate_limit.requests_per_minute": L,
        "rate_limit.default_max_tokens": L,
        "rate_limit.reserve_output": L,
        "rate_limit.output_percentile": L,
        "rate_limit.max_concurrent": L,
        "retry_policy.max_attempts": L,
        "retry_policy.backoff_ms": L,
        "retry_policy.max_backoff_ms": L,
        "retry_policy.max_retry_after_ms": L,
        "retry_policy.budget_ratio": L,
        "retry_policy.budget_window_sec": R,  # a running window keeps its length
        "retry_policy.budget_min_retries": L,
        "retry_policy.client_retries": L,
        "retry_policy.retry_unanswered": L,
        "health_check.enabled": R,  # the probe loops start with the process
        "health_check.interval_sec": L,
        "health_check.endpoint": L,
        "health_check.timeout_ms": L,
        "keys": L,
        "admin_key": L,
        "model_aliases": L,
        "breaker.failure_threshold": L,
        "breaker.failure_rate": L,
        "breaker.window_sec": R,  # a running window keeps its length
        "breaker.min_requests": L,
        "breaker.open_sec": L,
        "affinity.enabled": L,
        "affinity.load_factor": L,
        "sessions.max_per_key": L,
        "sessions.idle_sec": L,
        **dict.fromkeys(
            (
                "redis.url",
                "redis.password",
                "redis.sentinels",
                "redis.sentinel_service",
                "redis.sentinel_password",
                "redis.cluster",
                "redis.tls_ca_file",
                "redis.tls_cert_file",
                "redis.tls_key_file",
                "redis.tls_verify_hostname",
                "redis.fail_mode",
                "redis.assumed_replicas",
                "redis.key_prefix",
                "redis.timeout_ms",
                "redis.connect_timeout_ms",
                "redis.max_connections",
            ),
            R,
        ),
        # the HTTP body limit; uvicorn's WebSocket frame limit keeps its start value
        "server.max_body_bytes": L,
        "server.max_header_bytes": R,  # the edge middleware and uvicorn, built at start
        "server.max_headers": R,
        "server.drain_timeout_sec": R,  # uvicorn's graceful shutdown, set at start
        "server.drain_delay_sec": R,
        "server.worker_start_timeout_sec": R,  # uvicorn's supervisor reads it once
        "server.websocket_idle_timeout_sec": L,
        "server.max_websockets_per_key": L,
        "server.allowed_origins": R,
        "server.upstream_client": N,  # deprecated: always aiohttp
        **dict.fromkeys(
            (
                "database.url",
                "database.path",
                "database.pool_size",
                "database.max_overflow",
                "database.connect_timeout_sec",
                "database.statement_timeout_sec",
            ),
            R,
        ),
        "ledger.path": N,  # deprecated: the ledger lives in the database
        "ledger.flush_interval_sec": R,
        "ledger.max_buffered_rows": R,
        "ledger.minute_retention_days": R,
        "ledger.hour_retention_days": R,
        "ledger.spill_dir": R,
        "audit.retention_days": L,  # read at each audit upkeep
        **dict.fromkeys(
            (
                "alerts.webhooks",
                "alerts.thresholds",
                "alerts.secret_env",
                "alerts.max_attempts",
                "alerts.backoff_ms",
                "alerts.max_backoff_ms",
                "alerts.timeout_ms",
                "alerts.lease_sec",
                "alerts.check_interval_sec",
            ),
            R,
        ),
        "batch.path": N,  # deprecated: batches live in the database
        "batch.max_file_bytes": R,
        "batch.max_items": R,
        "batch.concurrency": R,
        "batch.share": L,
        "batch.lease_sec": R,
        "batch.defer_window": R,
        "batch.item_estimate_sec": R,
        "batch.defer_margin_sec": R,
        "ui.enabled": R,
        "ui.step_sec": R,
        "metrics.token": L,
        "responses.websocket": R,
        "responses.id_ttl_sec": R,
        "responses.max_local_ids": R,
        "responses.websocket_cached_responses": R,
        "billing.currency": L,
        "billing.timezone": L,  # periods from now on are in the new zone
        "billing.prices": L,
        "billing.windows": L,
        "teams": L,
        **dict.fromkeys(
            (
                "tracing.enabled",
                "tracing.endpoint",
                "tracing.service_name",
                "tracing.sample_ratio",
                "tracing.headers",
                "tracing.propagate",
            ),
            R,
        ),
    }
)


def effect_of(path: str) -> Effect:
    """A setting's effect, or that of the setting it is part of (`scale_up.max_inflight`
    when `scale_up` is one table); an undeclared path counts as a restart."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        effect = EFFECTS.get(".".join(parts[:end]))
        if effect is not None:
            return effect
    return Effect.RESTART


def setting_paths(model: type[BaseModel] = Settings, prefix: str = "") -> Iterator[str]:
    """Every path `app.config.diff` can report, read from the schema."""
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and not typing.get_args(sub):
            yield from setting_paths(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def pin_restart(old: Settings, new: Settings) -> Settings:
    """`new`, with the running value of every changed setting a reload cannot apply."""
    pinned = new
    for change in changes(old, new):
        if effect_of(change.path) is Effect.RESTART:
            pinned = _replace(pinned, change.path.split("."), change.old)
    return pinned


def _replace(model: BaseModel, path: list[str], value: object) -> typing.Any:
    head, *rest = path
    inner = value if not rest else _replace(getattr(model, head), rest, value)
    return model.model_copy(update={head: inner})
