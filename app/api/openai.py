"""Model listing routes served by FastAPI (the proxied POST routes are in `edge.py`).

`GET /v1/models` answers in the dialect the client speaks: Anthropic's shape (`type`,
`display_name`, `created_at`, cursor pagination with `has_more`, `first_id`, `last_id`)
when the request carries `anthropic-version`, as Anthropic's SDKs and Claude Code send
it, and OpenAI's otherwise. Either way the list is what the caller's key may use.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from app.api import views
from app.api.deps import CallerDep, GatewayDep
from app.errors import InvalidRequest, NotFound
from app.gateway import Gateway
from app.runtime import KeySpec

router = APIRouter()
AnthropicVersion = Annotated[str | None, Header(alias="anthropic-version")]


def _visible(gateway: Gateway, caller: KeySpec) -> list[str]:
    allowed = caller.models
    return [m for m in views.models(gateway) if allowed is None or m in allowed]


@router.get("/v1/models")
async def list_models(
    gateway: GatewayDep,
    caller: CallerDep,
    anthropic_version: AnthropicVersion = None,
    limit: int = 20,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, object]:
    ids = _visible(gateway, caller)
    if anthropic_version is not None:
        if not 1 <= limit <= 1000:
            raise InvalidRequest("'limit' must be between 1 and 1000", param="limit")
        return views.anthropic_models(ids, limit, after_id, before_id)
    return {"object": "list", "data": [views.openai_model(m) for m in ids]}


@router.get("/v1/models/{model_id:path}")
async def get_model(
    model_id: str,
    gateway: GatewayDep,
    caller: CallerDep,
    anthropic_version: AnthropicVersion = None,
) -> dict[str, object]:
    if model_id not in _visible(gateway, caller):
        raise NotFound(f"The model '{model_id}' does not exist", param="model")
    if anthropic_version is not None:
        return views.anthropic_model(model_id)
    return views.openai_model(model_id)
