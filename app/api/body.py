"""Reading a request body under a size limit, without buffering past it."""

from __future__ import annotations

from fastapi import Request

from app.errors import InvalidRequest, PayloadTooLarge


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds the gateway's limit of {limit} bytes (server.max_body_bytes)",
        should_retry=False,
    )


async def read_body(request: Request, limit: int) -> bytes:
    declared = next((v for k, v in request.scope["headers"] if k == b"content-length"), None)
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _too_large(limit)
        except ValueError:
            raise InvalidRequest("invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
