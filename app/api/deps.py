"""How handlers reach the gateway and the caller: read from `app.state` here only."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.types import Scope

from app.api.access_note import identify
from app.gateway import Gateway
from app.runtime import KeySpec


async def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(_gateway)]


def caller_of(scope: Scope, gateway: Gateway) -> KeySpec:
    """The key presented in an HTTP or WebSocket scope's headers."""
    authorization = api_key = None
    for name, value in scope["headers"]:  # one pass; Headers.get raises per miss
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"x-api-key":
            api_key = value.decode("latin-1")
    caller = gateway.keys.authenticate(authorization, api_key)
    identify(scope, caller)
    return caller


async def _caller(request: Request, gateway: GatewayDep) -> KeySpec:
    return caller_of(request.scope, gateway)


CallerDep = Annotated[KeySpec, Depends(_caller)]
