"""`/admin/*`: guarded by `TOKENGATE_ADMIN_KEY`; unset, every admin route answers 404."""

from __future__ import annotations

import hmac
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from app.api import views
from app.api.deps import GatewayDep
from app.db.engine import DatabaseUnavailable
from app.db.usage import UsageQuery
from app.errors import AuthenticationFailed, InvalidRequest, NotFound, ServiceUnavailable
from app.gateway import Gateway

router = APIRouter(prefix="/admin")


async def _admin(request: Request, gateway: GatewayDep) -> Gateway:
    key = gateway.runtime.settings.admin_key
    if key is None:
        raise NotFound("admin API disabled: set TOKENGATE_ADMIN_KEY to enable it")
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), key.get_secret_value().encode()
    ):
        raise AuthenticationFailed("admin key required: `Authorization: Bearer <admin key>`")
    return gateway


AdminDep = Annotated[Gateway, Depends(_admin)]


@router.get("/usage")
async def usage(
    gateway: AdminDep,
    start: Annotated[str | None, Query(alias="from")] = None,
    end: Annotated[str | None, Query(alias="to")] = None,
) -> dict[str, object]:
    """The ledger per key and model; `from` (inclusive) and `to` (exclusive) are ISO 8601
    instants (UTC if no zone) or epoch seconds."""
    query = UsageQuery(start=_instant(start, "from"), end=_instant(end, "to"))
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
    return {"object": "list", "data": rows}


def _instant(value: str | None, param: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(float(value))
    except OverflowError:  # 1e400: a number, but no instant
        raise InvalidRequest(f"'{param}' is out of range", param=param) from None
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


@router.put("/keys/{alias}/limits")
async def set_limits(alias: str, change: LimitsChange, gateway: AdminDep) -> dict[str, object]:
    key = gateway.keys.by_alias.get(alias)
    if key is None:
        raise NotFound(f"no gateway key with alias '{alias}'", param="alias")
    try:
        limits = await gateway.set_key_limits(
            key, change.requests_per_minute, change.tokens_per_minute
        )
    except DatabaseUnavailable:
        raise ServiceUnavailable(
            "live limits are kept in the database, which is unreachable: try again, or edit "
            "settings.json and send SIGHUP",
            code="database_unavailable",
            retry_after=5.0,
        ) from None
    if change.max_concurrent is not None:
        await gateway.set_key_concurrency(key, change.max_concurrent)
    return {
        "alias": alias,
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": gateway.pipeline.holds.gate.cap(alias, key.max_concurrent),
    }
