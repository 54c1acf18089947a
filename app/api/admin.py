"""`/admin/*`: guarded by `TOKENGATE_ADMIN_KEY`; unset, every admin route answers 404."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from app.api import views
from app.api.deps import GatewayDep
from app.errors import AuthenticationFailed, Conflict, NotFound
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
async def usage(gateway: AdminDep) -> dict[str, object]:
    await gateway.settled()
    rows = await gateway.ledger.rows()
    return {"object": "list", "data": [r.as_dict() for r in rows]}


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
    if not gateway.limits_shared and gateway.runtime.workers > 1:
        raise Conflict(
            "with --workers N and no Redis each worker holds its own limits, so a live change "
            "would reach one worker only: set TOKENGATE_REDIS_URL, or edit settings.json and "
            "send SIGHUP",
            code="not_shared",
        )
    limits = await gateway.set_key_limits(key, change.requests_per_minute, change.tokens_per_minute)
    if change.max_concurrent is not None:
        await gateway.set_key_concurrency(key, change.max_concurrent)
    return {
        "alias": alias,
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": gateway.pipeline.holds.gate.cap(alias, key.max_concurrent),
    }
