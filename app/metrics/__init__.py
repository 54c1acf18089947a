"""Every Prometheus metric, defined once and recorded through verbs.

Nothing else imports prometheus_client. Instruments live on an explicitly passed
`CollectorRegistry` (tests get a fresh one). With `--workers N` the CLI sets
`PROMETHEUS_MULTIPROC_DIR` before any worker imports this package, values go to
per-process files and `render()` aggregates them, so one scrape sums all workers.

The verbs also feed the status page's ring of recent traffic (`app.status`), when the
gateway attached one with `watch`: the page and Prometheus count the same events.

    base.py      the registry, label hygiene, cached children and tally cells
    traffic.py   `Metrics`: requests, tokens, dispatch, upstream attempts and domains
    agents.py    prompt-cache affinity, per-key concurrency, Responses WebSockets
    durable.py   database, ledger, shared-state Redis, housekeeping
    costs.py     cost, budgets, deferred work
"""

from app.metrics.base import (
    MAX_MODEL_LABELS,
    RedisStateLike,
    UsageLike,
    mark_process_dead,
    multiprocess_enabled,
)
from app.metrics.traffic import CONTENT_TYPE, Metrics, new_registry

__all__ = [
    "CONTENT_TYPE",
    "MAX_MODEL_LABELS",
    "Metrics",
    "RedisStateLike",
    "UsageLike",
    "mark_process_dead",
    "multiprocess_enabled",
    "new_registry",
]
