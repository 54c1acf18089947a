"""Reading a request body under a size limit, without buffering past it."""

from __future__ import annotations

from starlette.types import Receive, Scope

from app.errors import InvalidRequest, PayloadTooLarge


class ClientGone(Exception):
    """The client disconnected before its body arrived."""


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds the gateway's limit of {limit} bytes (server.max_body_bytes)",
        should_retry=False,
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _too_large(limit)  # refused before a byte of it is read
        except ValueError:
            raise InvalidRequest("invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
