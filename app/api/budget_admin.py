"""`/admin/budgets`: every key's and team's spend and budgets; raise a budget for a while.

    GET    /admin/budgets                    keys and teams: spend per current period,
                                             budgets with limit, spent, reserved,
                                             remaining, used ratio and reset time
    PUT    /admin/budgets/{scope}/{name}     a temporary limit for one period and metric,
                                             until a given instant (durable; every
                                             replica applies it within a second)
    DELETE /admin/budgets/{scope}/{name}     end it now (`?period=&metric=` to end one)

Money is a JSON number in `currency` (exact to the nano-unit in the ledger); tokens are
integers. Instants are ISO 8601 in `billing.timezone`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.api.admin import AdminDep, admin_name, parse_instant
from app.api.json_body import read_model
from app.billing.books import BudgetOverride
from app.billing.budget_rules import Amount
from app.billing.periods import Calendar, Span
from app.billing.prices import amount, to_nanos
from app.billing.spend import BudgetState, OwnerView
from app.db.engine import DatabaseUnavailable
from app.errors import InvalidRequest, NotFound, ServiceUnavailable
from app.gateway import Gateway
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope

router = APIRouter(prefix="/admin")


class BudgetChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    period: BudgetPeriod
    max_cost: Decimal | None = Field(None, gt=0, decimal_places=9, allow_inf_nan=False)
    max_tokens: int | None = Field(None, gt=0)
    until: str | int | float = Field(
        description="When the temporary limit ends: ISO 8601 (UTC if no zone) or epoch s"
    )

    @model_validator(mode="after")
    def _one_limit(self) -> BudgetChange:
        if (self.max_cost is None) == (self.max_tokens is None):
            raise ValueError("give one of `max_cost` or `max_tokens`")
        return self


@router.get("/budgets")
async def budgets(gateway: AdminDep) -> dict[str, object]:
    try:
        owners = await gateway.live.budget_view()
    except DatabaseUnavailable:
        raise _db_down() from None
    return {
        "object": "list",
        "currency": gateway.spend.currency,
        "timezone": gateway.calendar.timezone,
        "data": [_owner(o, gateway.calendar) for o in owners],
    }


@router.put("/budgets/{scope}/{name}")
async def raise_budget(
    scope: BudgetScope, name: str, request: Request, gateway: AdminDep
) -> dict[str, object]:
    _known(gateway, scope, name)
    change = await read_model(request, BudgetChange)
    until = parse_instant(str(change.until), "until")
    assert until is not None
    if until <= gateway.spend.clock():
        raise InvalidRequest("'until' must be in the future", param="until")
    metric = "cost" if change.max_cost is not None else "tokens"
    limit = to_nanos(change.max_cost) if change.max_cost is not None else change.max_tokens
    assert limit is not None
    budget = f"{change.period}_{metric}"
    try:
        before = await _limit_of(gateway, scope, name, budget)
        await gateway.live.set_budget(
            BudgetOverride(scope, name, change.period, metric, limit, until)
        )
        (owner,) = [
            o for o in await gateway.live.budget_view() if (o.scope, o.name) == (scope, name)
        ]
    except DatabaseUnavailable:
        raise _db_down() from None
    (state,) = [b for b in owner.budgets if b.budget.name == budget]
    shown = _budget(state, gateway.calendar)
    after = {k: shown[k] for k in _AUDITED}
    entry = ("budget_override.set", f"{scope}:{name}:{budget}", before, after)
    await gateway.audit.record(admin_name(request), [entry])
    return shown


_AUDITED = ("limit", "configured_limit", "override")


async def _limit_of(gateway: Gateway, scope: str, name: str, budget: str) -> object:
    """A budget's limit as the audit trail shows it (None: the owner had no such budget)."""
    for owner in await gateway.live.budget_view():
        if (owner.scope, owner.name) == (scope, name):
            for state in owner.budgets:
                if state.budget.name == budget:
                    shown = _budget(state, gateway.calendar)
                    return {k: shown[k] for k in _AUDITED}
    return None


@router.delete("/budgets/{scope}/{name}")
async def end_budget(
    scope: BudgetScope,
    name: str,
    gateway: AdminDep,
    request: Request,
    period: Annotated[BudgetPeriod | None, Query()] = None,
    metric: Annotated[BudgetMetric | None, Query()] = None,
) -> dict[str, object]:
    _known(gateway, scope, name)
    try:
        ended = await gateway.live.end_budget(scope, name, period, metric)
    except DatabaseUnavailable:
        raise _db_down() from None
    if ended:
        which = {"period": period, "metric": metric, "ended": ended}
        entry = ("budget_override.ended", f"{scope}:{name}", which, None)
        await gateway.audit.record(admin_name(request), [entry])
    return {"scope": scope, "name": name, "ended": ended}


def _known(gateway: Gateway, scope: str, name: str) -> None:
    runtime = gateway.runtime
    names = [k.alias for k in runtime.keys] if scope == "key" else [t.name for t in runtime.teams]
    if name not in names:
        raise NotFound(f"no {scope} named '{name}'", param="name")


def _db_down() -> ServiceUnavailable:
    return ServiceUnavailable(
        "budgets are kept in the database, which is unreachable; try again shortly",
        code="database_unavailable",
        retry_after=5.0,
    )


def _owner(o: OwnerView, calendar: Calendar) -> dict[str, object]:
    return {
        "scope": o.scope,
        "name": o.name,
        "team": o.team,
        "spend": {
            period: {**_window(w, calendar), **_amounts(spent)}
            for period, (w, spent) in o.spend.items()
        },
        "budgets": [_budget(b, calendar) for b in o.budgets],
    }


def _budget(state: BudgetState, calendar: Calendar) -> dict[str, object]:
    b = state.budget

    def show(value: int) -> float | int:
        return amount(value) if b.metric == "cost" else value

    override = state.override
    return {
        "name": b.name,
        "period": b.period,
        "metric": b.metric,
        "limit": show(b.limit),
        "on_short": b.on_short,
        "configured_limit": None if state.configured is None else show(state.configured),
        "override": None
        if override is None
        else {"limit": show(override.limit), "until": calendar.describe(override.until)},
        "spent": show(state.spent),
        "reserved": show(state.reserved),
        "remaining": show(max(0, b.limit - state.spent - state.reserved)),
        "used_ratio": round(state.ratio, 6),
        **_window(state.window, calendar),
    }


def _window(w: Span, calendar: Calendar) -> dict[str, Any]:
    return {
        "period_id": w.id,
        "period_start": calendar.describe(w.start),
        "resets_at": calendar.describe(w.end),
    }


def _amounts(spent: Amount) -> dict[str, object]:
    return {"cost": amount(spent.cost), "tokens": spent.tokens}
