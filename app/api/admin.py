"""`/admin/*`: guarded by `TOKENGATE_ADMIN_KEY`; unset, every admin route answers 404."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.api.deps import GatewayDep
from app.errors import AuthenticationFailed, NotFound
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
    rows = await gateway.store.usage()
    return {"object": "list", "data": [r.as_dict() for r in rows]}
