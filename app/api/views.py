"""The gateway seen from outside: the bodies of `/health/ready`, `/admin/status` and
`GET /v1/models`.

Views only read: the gateway owns the lifecycle and its parts, these functions say
what orchestrators, operators and clients are shown of them. Their JSON is part of
the contract (tests compare bytes), so a field is added here on purpose, never as a
side effect of a change to the gateway.
"""

from __future__ import annotations

import time

from app.gateway import Gateway
from app.pipeline.aliases import is_pattern


def readiness(gateway: Gateway) -> tuple[bool, dict[str, object]]:
    """Ready while not draining, some domain is available and the limit store admits."""
    domains = gateway.domains
    ready = not gateway.draining and any(d.available() for d in domains)
    body: dict[str, object] = {
        "status": "ready" if ready else ("draining" if gateway.draining else "unavailable"),
        "domains": {d.name: d.status() for d in domains},
        "routes": gateway.route_state(),
    }
    store = gateway.store
    body.update(store.health())
    body["database"] = gateway.database_health()
    if store.refusing():
        ready = False
        body["status"] = "unavailable"
    return ready, body


def status(gateway: Gateway) -> dict[str, object]:
    s = gateway.runtime.settings
    return {
        "cluster": s.cluster.name,
        "uptime_sec": round(time.time() - gateway.started_at, 1),
        "draining": gateway.draining,
        "workers": gateway.runtime.workers,
        "auth": gateway.runtime.auth_enabled,
        "domains": {
            d.name: {
                **d.status(),
                "retry_budget": d.budget.snapshot(),
                "queue_by_priority": d.dispatcher.queue.depth_by_priority(),
                "dispatch": d.dispatcher.settings(),
            }
            for d in gateway.domains
        },
        "limits": _limits(gateway),
        "routes": {
            "default": s.model_route.default,
            "fallback": list(gateway.runtime.fallbacks),
            "aliases": s.model_aliases,
        },
        "tasks": gateway.background_tasks,
        "deferred": list(gateway.batch_runner.held.values()),
        "audit": [
            {**row, "at": gateway.calendar.describe(row["at"])} for row in gateway.audit.recent
        ],
    }


def _limits(gateway: Gateway) -> dict[str, object]:
    s, admission, holds = gateway.runtime.settings, gateway.admission, gateway.pipeline.holds
    keys = [
        {
            "alias": k.alias,
            "priority": k.priority,
            "domain": k.domain,
            "models": sorted(k.models) if k.models is not None else None,
            "limits": admission.limits_for(k)._asdict(),
            "live_override": k.alias in admission.overrides,
            "max_concurrent": holds.gate.cap(k.alias, k.max_concurrent),
            "reserve_output": k.reserve_output or s.rate_limit.reserve_output,
        }
        for k in gateway.runtime.keys
    ]
    return {
        "store": gateway.store.describe(),
        "per_worker_divisor": admission.divisor,
        "default": {
            "requests_per_minute": s.rate_limit.requests_per_minute,
            "tokens_per_minute": s.rate_limit.tokens_per_minute,
        },
        "keys": keys,
    }


def models(gateway: Gateway) -> list[str]:
    """Every model some domain lists, and every alias (clients may ask for either; a
    pattern alias such as `claude-*` names no model, so it is not listed)."""
    seen: set[str] = set()
    for d in gateway.domains:
        seen |= set(d.models() or ())
    seen |= {a for a in gateway.runtime.settings.model_aliases if not is_pattern(a)}
    return sorted(seen)


def openai_model(model: str) -> dict[str, object]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "tokengate"}


def anthropic_model(model: str) -> dict[str, object]:
    return {
        "type": "model",
        "id": model,
        "display_name": model,
        "created_at": "1970-01-01T00:00:00Z",
    }


def anthropic_models(
    ids: list[str], limit: int, after: str | None, before: str | None
) -> dict[str, object]:
    """Anthropic's page: `limit` ids after `after_id` (or just before `before_id`)."""
    if after is not None:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
        page, more = ids[:limit], len(ids) > limit
    elif before is not None:
        ids = ids[: ids.index(before)] if before in ids else []
        page, more = ids[-limit:], len(ids) > limit
    else:
        page, more = ids[:limit], len(ids) > limit
    return {
        "data": [anthropic_model(m) for m in page],
        "has_more": more,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }
