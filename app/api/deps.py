"""How handlers reach the gateway and the caller: read from `app.state` here only."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.gateway import Gateway
from app.runtime import KeySpec


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(_gateway)]


def _caller(request: Request, gateway: GatewayDep) -> KeySpec:
    headers = request.headers
    return gateway.keys.authenticate(headers.get("authorization"), headers.get("x-api-key"))


CallerDep = Annotated[KeySpec, Depends(_caller)]


def request_id(request: Request) -> str:
    rid: str = request.scope["state"]["request_id"]
    return rid
