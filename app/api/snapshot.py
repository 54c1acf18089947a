"""The body of `GET /admin/ui/snapshot`: everything the status page draws, in one read.

    replica / replicas   which process answered, and the others the shared store knows
    attention            what an operator on call should look at first, worst first
                         (derived here, so the page only draws it)
    status               `/admin/status` as it is (domains, limits, routes), not a copy
    keys                 per key: what is left of its request and token limits
    series, errors       the last 15 minutes and the last error answers (`app.status`)

With `--workers N` each worker is its own replica: a snapshot shows the traffic of the
worker that answered it (Prometheus sums them all).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from app.api import views
from app.billing.prices import amount, render
from app.billing.spend import BudgetState
from app.dispatch.domain import Domain
from app.gateway import Gateway
from app.kinds import DomainState
from app.limits.admission import KeyUse
from app.runtime import KeySpec
from app.status.board import StatusBoard

NEAR_LIMIT = 0.1  # a key with less than this share of a limit left is worth a look
NEAR_BUDGET = 0.8  # a budget this much spent is worth a look (the alert's threshold)
QUEUE_NEARLY_FULL = 0.8
ERROR_SHARE = 0.05  # of the last minute's answers being 5xx
CRITICAL, WARNING = "critical", "warning"


async def snapshot(gateway: Gateway, board: StatusBoard) -> dict[str, object]:
    now = time.time()
    ready, health = views.readiness(gateway)
    status = views.status(gateway)
    capacity = gateway.runtime.settings.token_scheduler.queue_capacity
    for body in status["domains"].values():  # type: ignore[attr-defined]
        body["queue_capacity"] = capacity
    uses = [(k, gateway.admission.use(k)) for k in _keys(gateway)]
    budgets = gateway.spend.states(now)
    return {
        "generated_unix": round(now, 3),
        "replica": {
            "id": gateway.replica_id,
            "pid": os.getpid(),
            "workers": gateway.runtime.workers,
        },
        "replicas": _replicas(await gateway.replicas(), gateway.replica_id, now),
        "ready": ready,
        "readiness": health["status"],
        "attention": [
            {"level": level, "text": text}
            # critical first; sorted() keeps the order of the checks within a level
            for level, text in sorted(
                attention(gateway, board, uses, budgets), key=lambda a: a[0] != CRITICAL
            )
        ],
        "status": status,
        "keys": [_key(k, use, _fullest(k, budgets)) for k, use in uses],
        "sessions": _sessions(gateway, now),
        **board.snapshot(),
    }


def _sessions(gateway: Gateway, now: float) -> list[dict[str, object]]:
    """Today's costliest agent sessions on this process (`app.limits.sessions`)."""
    currency = gateway.pipeline.prices.currency
    return [
        {
            "session": label,
            "key": key,
            "requests": spent.requests,
            "tokens": spent.tokens,
            "cost": render(spent.cost),
            "currency": currency,
            "last_seen_sec": round(max(0.0, now - spent.last), 1),
        }
        for key, label, spent in gateway.pipeline.session_spend.costliest(10)
    ]


def _keys(gateway: Gateway) -> list[KeySpec]:
    if gateway.keys.enabled:
        return list(gateway.runtime.keys)
    return [gateway.keys.anonymous]  # --no-auth: every request is the anonymous key's


def _fullest(key: KeySpec, budgets: Sequence[BudgetState]) -> BudgetState | None:
    """The key's budget nearest its limit, its team's included (either refuses it)."""
    mine = [
        b
        for b in budgets
        if (b.budget.scope, b.budget.owner) in (("key", key.alias), ("team", key.team))
    ]
    return max(mine, key=lambda b: b.ratio, default=None)


def _budget(state: BudgetState | None) -> dict[str, object] | None:
    if state is None:
        return None
    b = state.budget
    show = amount if b.metric == "cost" else int
    period = b.period if b.scope == "key" else f"{b.period}, team {b.owner}"
    return {
        "used": show(state.spent),
        "limit": show(b.limit),
        "period": f"{period} {b.metric}",
        "metric": b.metric,
        "scope": b.scope,
        "resets_at": state.window.end,
    }


def _key(key: KeySpec, use: KeyUse, budget: BudgetState | None = None) -> dict[str, object]:
    left = use.remaining
    return {
        "alias": key.alias,
        "priority": key.priority,
        "domain": key.domain,
        "requests": {
            "limit": use.limits.requests_per_minute,
            "remaining": None if left is None else left.requests,
        },
        "tokens": {
            "limit": use.limits.tokens_per_minute,
            "remaining": None if left is None else left.tokens,
        },
        "source": use.source,
        "age_sec": use.age_sec,
        # The budget nearest its limit (the key's or its team's); the page adds a column
        # as soon as an entry carries one: {"used": .., "limit": .., "period": ..}.
        "budget": _budget(budget),
    }


def _replicas(seen: dict[str, float], me: str, now: float) -> list[dict[str, object]]:
    return [
        {"id": rid, "last_seen_sec": round(max(0.0, now - at), 1), "self": rid == me}
        for rid, at in sorted(seen.items(), key=lambda item: (item[0] != me, item[0]))
    ]


# -- what needs a look ------------------------------------------------------------------
def attention(
    gateway: Gateway,
    board: StatusBoard,
    uses: list[tuple[KeySpec, KeyUse]],
    budgets: Sequence[BudgetState] = (),
) -> Iterator[tuple[str, str]]:
    """(level, sentence) pairs: `critical` when requests fail now, else `warning`."""
    if gateway.draining:
        yield WARNING, "this replica is draining: readiness answers 503, new work goes elsewhere"
    store = gateway.store.describe()
    if store.get("state") == "misconfigured":
        yield CRITICAL, "Redis is misconfigured (a Cluster configured as one server): see the log"
    elif gateway.store.refusing():
        yield CRITICAL, "Redis is unreachable and fail mode is closed: requests get 503"
    elif store.get("up") is False:
        yield WARNING, "Redis is unreachable: each replica enforces its share of every limit"
    for domain in gateway.domains:
        yield from _domain(domain, gateway.runtime.settings.token_scheduler.queue_capacity)
    for model in gateway.route_state()["unresolved"]:
        yield WARNING, f"route target '{model}' is listed by no domain's /v1/models"
    for key, use in uses:
        yield from _near_limit(key.alias, use)
    for state in budgets:
        yield from _near_budget(state)
    answers = board.ring.recent_statuses(60)
    total = sum(answers.values())
    if total and answers["5xx"] / total > ERROR_SHARE:
        yield CRITICAL, f"{answers['5xx'] / total:.0%} of the last minute's answers were 5xx"


def _domain(domain: Domain, capacity: int) -> Iterator[tuple[str, str]]:
    name, state = domain.name, domain.state()
    why = f": {domain.why()}" if domain.why() else ""
    if state is DomainState.CIRCUIT_OPEN:
        yield CRITICAL, f"domain {name}: circuit open after repeated upstream failures{why}"
    elif state is DomainState.UNHEALTHY:
        yield CRITICAL, f"domain {name}: its health probe fails{why}"
    elif state is DomainState.QUOTA_EXHAUSTED:
        yield CRITICAL, f"domain {name}: the upstream account's balance is exhausted"
    elif state is DomainState.THROTTLED:
        cooling = domain.dispatcher.pacer.cooling()
        yield WARNING, f"domain {name}: the upstream answered 429, cooling down {cooling:.1f}s"
    depth = len(domain.dispatcher.queue)
    if depth >= QUEUE_NEARLY_FULL * capacity:
        yield WARNING, f"domain {name}: {depth} queued of {capacity} (full answers 503)"


def _near_limit(alias: str, use: KeyUse) -> Iterator[tuple[str, str]]:
    if use.remaining is None:
        return
    for kind, left, limit in (
        ("requests", use.remaining.requests, use.limits.requests_per_minute),
        ("tokens", use.remaining.tokens, use.limits.tokens_per_minute),
    ):
        if left < NEAR_LIMIT * limit:
            yield WARNING, f"key {alias}: {limit - left} of its {limit} {kind}/min in use"


def _near_budget(state: BudgetState) -> Iterator[tuple[str, str]]:
    b = state.budget
    if state.ratio >= 1:
        yield (
            CRITICAL,
            (
                f"{b.scope} {b.owner}: its {b.period} {b.metric} budget is spent; its requests "
                "get 429 budget_exceeded until the period resets"
            ),
        )
    elif state.ratio >= NEAR_BUDGET:
        yield (
            WARNING,
            f"{b.scope} {b.owner}: {state.ratio:.0%} of its {b.period} {b.metric} budget spent",
        )
