"""`/admin/*`: guarded by `TOKENGATE_ADMIN_KEY`; unset, every admin route answers 404."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from app.api import views
from app.api.deps import GatewayDep
from app.api.json_body import read_model
from app.auth import bearer_matches
from app.billing.periods import Calendar
from app.billing.usage_report import QUARTER, Granularity, Report, build
from app.db.engine import DatabaseUnavailable
from app.db.usage import UsageQuery
from app.errors import AuthenticationFailed, InvalidRequest, NotFound, ServiceUnavailable
from app.gateway import Gateway
from app.runtime import KeySpec

router = APIRouter(prefix="/admin")
ADMIN_NAME = "admin"  # the name of the `TOKENGATE_ADMIN_KEY` credential in the audit trail


async def _admin(request: Request, gateway: GatewayDep) -> Gateway:
    key = gateway.runtime.settings.admin_key
    if key is None:
        raise NotFound("admin API disabled: set TOKENGATE_ADMIN_KEY to enable it")
    if not bearer_matches(request.headers.get("authorization"), key.get_secret_value()):
        raise AuthenticationFailed("admin key required: `Authorization: Bearer <admin key>`")
    request.state.admin_name = ADMIN_NAME
    return gateway


def admin_name(request: Request) -> str:
    """Who made a change through the admin API (the audit trail's `actor`): the name the
    admin credential check left on the request."""
    return str(getattr(request.state, "admin_name", ADMIN_NAME))


AdminDep = Annotated[Gateway, Depends(_admin)]


GROUPS = ("key", "team", "model", "domain", "session", "window")


@router.get("/usage", response_model=None)
async def usage(
    request: Request,
    gateway: AdminDep,
    start: Annotated[str | None, Query(alias="from")] = None,
    end: Annotated[str | None, Query(alias="to")] = None,
    group_by: Annotated[str | None, Query()] = None,
    granularity: Annotated[Literal["hour", "day"] | None, Query()] = None,
) -> Any:
    """The ledger, priced: per key and model (default), or grouped by any of key, team,
    model, domain, window (`group_by=team,model`; `window`: the billing window), per
    local hour or day of `billing.timezone` (`granularity`); `from` (inclusive) and `to`
    (exclusive) are ISO 8601 instants (UTC if no zone) or epoch seconds. CSV with
    `Accept: text/csv`. The default answer keeps its first shape (`object`, `data`);
    asked for groups or periods it adds `totals`."""
    groups = _groups(group_by)
    query = UsageQuery(
        start=parse_instant(start, "from", gateway.calendar),
        end=parse_instant(end, "to", gateway.calendar),
        group_by=groups,
        granularity=QUARTER if granularity else None,
    )
    report = await _report(gateway, query, granularity)
    if "text/csv" in request.headers.get("accept", ""):
        return Response(report.csv(), media_type="text/csv; charset=utf-8")
    body: dict[str, object] = {"object": "list", "data": report.rows()}
    if group_by is not None or granularity is not None:
        body |= {
            "group_by": list(groups),
            "granularity": granularity,
            "currency": report.currency,
            "timezone": report.calendar.timezone,
            "totals": report.totals(),
        }
    return body


async def _report(gateway: Gateway, query: UsageQuery, granularity: Granularity | None) -> Report:
    await gateway.settled()
    try:
        rows = await gateway.ledger.report(query)
    except DatabaseUnavailable:
        raise ServiceUnavailable(
            "the usage ledger's database is unreachable; usage is kept and written when it "
            "returns (see /health/ready)",
            code="database_unavailable",
            retry_after=5.0,
        ) from None
    return build(
        rows,
        group_by=query.group_by,
        granularity=granularity,
        calendar=gateway.calendar,
        currency=gateway.runtime.settings.billing.currency,
    )


def _groups(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ("key", "model")
    groups = tuple(dict.fromkeys(g.strip() for g in value.split(",") if g.strip()))
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise InvalidRequest(
            f"'group_by' takes one or more of {', '.join(GROUPS)} (comma-separated)",
            param="group_by",
        )
    return groups


def parse_instant(value: str | None, param: str, calendar: Calendar | None = None) -> int | None:
    """Epoch seconds, or ISO 8601 (UTC if no zone); a bare date is its midnight in
    `billing.timezone` when a calendar is given (reports: `from=2026-11-01`)."""
    if value is None or value == "":
        return None
    try:
        return int(float(value))
    except OverflowError:  # 1e400: a number, but no instant
        raise InvalidRequest(f"'{param}' is out of range", param=param) from None
    except ValueError:
        pass
    if calendar is not None and len(value) == 10:
        try:
            return int(calendar.midnight(date.fromisoformat(value)))
        except ValueError:
            pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(
            f"'{param}' must be an ISO 8601 instant (2025-01-31T00:00:00Z) or epoch seconds",
            param=param,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp())


@router.get("/status")
async def status(gateway: AdminDep) -> dict[str, object]:
    return views.status(gateway)


class LimitsChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)
    max_concurrent: int | None = Field(None, gt=0)


def _key(gateway: Gateway, alias: str) -> KeySpec:
    key = gateway.keys.by_alias.get(alias)
    if key is None:
        raise NotFound(f"no gateway key with alias '{alias}'", param="alias")
    return key


def _database_down() -> ServiceUnavailable:
    return ServiceUnavailable(
        "live limits are kept in the database, which is unreachable: try again, or edit "
        "settings.json and send SIGHUP",
        code="database_unavailable",
        retry_after=5.0,
    )


def _limits_now(gateway: Gateway, key: KeySpec) -> dict[str, object]:
    limits = gateway.admission.limits_for(key)
    return {
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": gateway.pipeline.holds.gate.cap(key.alias, key.max_concurrent),
    }


@router.put("/keys/{alias}/limits")
async def set_limits(alias: str, request: Request, gateway: AdminDep) -> dict[str, object]:
    key = _key(gateway, alias)
    change = await read_model(request, LimitsChange)
    before = _limits_now(gateway, key)
    try:
        limits = await gateway.live.set_key_limits(
            key, change.requests_per_minute, change.tokens_per_minute
        )
    except DatabaseUnavailable:
        raise _database_down() from None
    if change.max_concurrent is not None:
        await gateway.live.set_key_concurrency(key, change.max_concurrent)
    after = {
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": gateway.pipeline.holds.gate.cap(alias, key.max_concurrent),
    }
    entry = ("key_limits.set", f"key:{alias}", before, after)
    await gateway.audit.record(admin_name(request), [entry])
    return {"alias": alias, **after}


@router.delete("/keys/{alias}/limits")
async def clear_limits(alias: str, gateway: AdminDep, request: Request) -> dict[str, object]:
    """Clear a live override: the key's limits are the files' again (on every replica)."""
    key = _key(gateway, alias)
    before = _limits_now(gateway, key)
    try:
        cleared = await gateway.live.clear_key_limits(key)
    except DatabaseUnavailable:
        raise _database_down() from None
    after = {
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        "max_concurrent": key.max_concurrent,
    }
    if cleared:
        entry = ("key_limits.cleared", f"key:{alias}", before, after)
        await gateway.audit.record(admin_name(request), [entry])
    return {"alias": alias, "cleared": cleared, **after}
