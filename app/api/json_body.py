"""The JSON body of an admin route, read the way the `/v1/` routes read theirs.

No `Content-Type` at all, `application/json` (any parameters) or a `+json` type is read
as JSON; anything else is 415 with the fix, where FastAPI's own body reading would take
a form-encoded body (what `curl -d` sends without `-H`) for a string and answer "Input
should be a valid dictionary". The model validates what was read; its first complaint
is the 400's message, naming the field.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.errors import InvalidRequest, UnsupportedMediaType

M = TypeVar("M", bound=BaseModel)


def is_json(content_type: str | None) -> bool:
    """True for no content type, `application/json` and `application/<x>+json`."""
    if content_type is None or not content_type.strip():
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


async def read_model(request: Request, model: type[M]) -> M:
    content_type = request.headers.get("content-type")
    if not is_json(content_type):
        shown = (content_type or "").split(";", 1)[0].strip()[:80]
        raise UnsupportedMediaType(
            f"the body must be JSON: send `Content-Type: application/json` (or none), not "
            f"`{shown}` (with curl: -H 'Content-Type: application/json')"
        )
    raw = await request.body()
    try:
        data: Any = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        where = loc or "body"
        raise InvalidRequest(
            f"{where}: {first.get('msg', 'invalid value')}", param=loc or None
        ) from None
