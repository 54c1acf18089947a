"""A new value for every setting of the schema, all valid together: what a test changes
to see how each takes effect (`tests/e2e/test_reload.py` over SIGHUP,
`tests/unit/config/test_effects.py` in-process)."""

from __future__ import annotations

from typing import Any

NEW_ADMIN = "admin-reload-key-new-98765"
METRICS_TOKEN = "metrics-reload-token-4242"

# The value each setting takes in the reloaded files (all valid together). What the seed
# or the test fixture already sets differs from the schema default, so each is changed
# from what the running gateway has. Per-domain paths are changed in their own test.
NEW: dict[str, Any] = {
    "cluster.name": "supernode-reloaded",
    "cluster.node_count": 9,
    "cluster.gpu_per_node": 4,
    "cluster.total_gpus": 36,
    "token_scheduler.api_key_env": "RELOAD_UNUSED_KEY_ENV",
    "token_scheduler.timeout_ms": 20000,
    "token_scheduler.connect_timeout_ms": 4000,
    "token_scheduler.max_retries": 1,
    "token_scheduler.batch_size": 8,
    "token_scheduler.batch_window_ms": 3.0,
    "token_scheduler.queue_capacity": 77,
    "token_scheduler.max_queue_wait_ms": 12000,
    "token_scheduler.flex_max_queue_wait_ms": 500000,
    "token_scheduler.max_inflight": 11,
    "scale_out.enabled": False,
    "scale_out.protocol": "roce",
    "scale_out.fallback": "udp",
    "logging.log_prompts": True,
    "model_route.default": "gpt-4o",
    "model_route.fallback": "claude-sonnet",
    "rate_limit.tokens_per_minute": 90000,
    "rate_limit.requests_per_minute": 2,
    "rate_limit.default_max_tokens": 512,
    "rate_limit.reserve_output": "max_tokens",
    "rate_limit.output_percentile": 0.9,
    "rate_limit.max_concurrent": 5,
    "retry_policy.max_attempts": 2,
    "retry_policy.backoff_ms": 300,
    "retry_policy.max_backoff_ms": 4000,
    "retry_policy.max_retry_after_ms": 10000,
    "retry_policy.budget_ratio": 0.3,
    "retry_policy.budget_window_sec": 20,
    "retry_policy.budget_min_retries": 5,
    "retry_policy.client_retries": "client",
    "retry_policy.retry_unanswered": True,
    "health_check.enabled": False,
    "health_check.interval_sec": 31,
    "health_check.endpoint": "/v1/models?reloaded=1",
    "health_check.timeout_ms": 4000,
    "keys": None,  # alice kept, bob added (below)
    "admin_key": NEW_ADMIN,
    "model_aliases": {"tiny": "gpt-4o"},
    "breaker.failure_threshold": 6,
    "breaker.failure_rate": 0.6,
    "breaker.window_sec": 40,
    "breaker.min_requests": 30,
    "breaker.open_sec": 12,
    "affinity.enabled": False,
    "affinity.load_factor": 1.5,
    "sessions.max_per_key": 32,
    "sessions.idle_sec": 600,
    "redis.url": "rediss://127.0.0.1:1/0",
    "redis.password": "reloaded-redis-password",
    "redis.sentinel_service": "mymaster",
    "redis.sentinel_password": "reloaded-sentinel-password",
    "redis.cluster": True,
    "redis.tls_ca_file": "/nonexistent/ca.pem",
    "redis.tls_cert_file": "/nonexistent/cert.pem",
    "redis.tls_key_file": "/nonexistent/key.pem",
    "redis.tls_verify_hostname": False,
    "redis.fail_mode": "closed",
    "redis.assumed_replicas": 2,
    "redis.key_prefix": "reloaded:",
    "redis.timeout_ms": 300,
    "redis.connect_timeout_ms": 1500,
    "redis.max_connections": 32,
    "server.max_body_bytes": 4000,
    "server.max_header_bytes": 32768,
    "server.max_headers": 64,
    "server.drain_timeout_sec": 20,
    "server.drain_delay_sec": 1,
    "server.worker_start_timeout_sec": 45,
    "server.websocket_idle_timeout_sec": 200,
    "server.max_websockets_per_key": 8,
    "server.allowed_origins": ["https://ops.example"],
    "server.upstream_client": "native",
    "database.url": "postgresql://tg:pw@127.0.0.1:1/tokengate",
    "database.path": None,  # the fixture's file; changed below
    "database.pool_size": 3,
    "database.max_overflow": 2,
    "database.connect_timeout_sec": 3,
    "database.statement_timeout_sec": 20,
    "ledger.path": "var/old-ledger.sqlite3",
    "ledger.flush_interval_sec": 2.0,
    "ledger.max_buffered_rows": 1000,
    "ledger.minute_retention_days": 7,
    "ledger.hour_retention_days": 30,
    "ledger.spill_dir": "var/spill",
    "audit.retention_days": 100,
    "alerts.webhooks": [{"url": "http://127.0.0.1:1/hook"}],
    "alerts.thresholds": [90],
    "alerts.secret_env": "RELOAD_ALERTS_SECRET",
    "alerts.max_attempts": 3,
    "alerts.backoff_ms": 2000,
    "alerts.max_backoff_ms": 60000,
    "alerts.timeout_ms": 5000,
    "alerts.lease_sec": 20.0,
    "alerts.check_interval_sec": 7.0,
    "batch.path": "var/old-batches.sqlite3",
    "batch.max_file_bytes": 1000000,
    "batch.max_items": 100,
    "batch.concurrency": 4,
    "batch.share": 0.25,
    "batch.lease_sec": 20,
    "batch.defer_window": "none",
    "batch.item_estimate_sec": 3.0,
    "batch.defer_margin_sec": 600.0,
    "ui.enabled": False,
    "ui.step_sec": 10,
    "metrics.token": METRICS_TOKEN,
    "responses.websocket": False,
    "responses.id_ttl_sec": 3600,
    "responses.max_local_ids": 1000,
    "responses.websocket_cached_responses": 2,
    "billing.currency": "CNY",
    "billing.timezone": "Asia/Shanghai",
    "billing.prices": {"gpt-4o": {"input": 2.5, "output": 10}},
    "billing.windows": {"night": {"start": "00:00", "end": "06:00"}},
    "teams": [{"name": "research", "budgets": [{"period": "day", "max_tokens": 100000}]}],
    "tracing.enabled": True,
    "tracing.endpoint": "http://127.0.0.1:1/v1/traces",
    "tracing.service_name": "tokengate-reloaded",
    "tracing.sample_ratio": 0.5,
    "tracing.headers": "x-api-key=reloaded-trace-key",
    "tracing.propagate": False,
}
# Changed in their own test or their own reload below: the domain's address (judged per
# domain), the upstream key (it would refuse everything after it) and the log level (it
# would hide the notes of this reload).
SEPARATE = {
    "scale_up",
    "api_key",
    "logging.level",
    "logging.output",
    "api_endpoint",
    "token_scheduler.api_base",
    "cluster.scale_up_domain",
    "redis.sentinels",  # not beside redis.url: its own reload below
}


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *sections, leaf = path.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out
