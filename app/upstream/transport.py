"""The seam between the pipeline and an HTTP client library, and what an answer must be.

`Transport.request` sends one request and returns its answer at the head
(`UpstreamResponse`); the body is read whole or as it arrives. Production uses aiohttp
(`session.AiohttpTransport`); unit tests inject any httpx transport
(`httpx_transport.HttpxTransport` over `MockTransport` / `ASGITransport`). Whatever the library,
its failures reach the pipeline as `AttemptFailed`, never as its own exceptions.

`refused` is the one judgement both make on a head before the body is touched: the
gateway asked for an API answer, so a final 1xx (a `101 Switching Protocols` to a POST)
is no answer; a transfer coding other than `chunked` is framing no HTTP library the
gateway uses decodes (h11, behind httpx and uvicorn, refuses it too; aiohttp would hand
`gzip` bytes through as if they were the body, or wait for a close that may never
come); and a content coding the library cannot undo would be relayed as garbage,
since the gateway reads, rewrites and re-frames every body it relays.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from app.upstream.attempt import AttemptFailed, Reason

# Content codings the clients decode (aiohttp and httpx both undo these two with zlib).
DECODED = frozenset({"", "identity", "gzip", "deflate"})


@dataclass(frozen=True)
class Timeouts:
    connect: float
    read: float


class UpstreamResponse(Protocol):
    status: int

    @property
    def headers(self) -> Mapping[str, str]:
        """Lower-case names; a repeated field reads as its values joined with ", "."""
        ...

    @property
    def complete(self) -> bool:
        """True once the whole body has arrived (the relay then ends the client's answer
        with its last bytes, one write instead of two); False when the client can't tell."""
        ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class Transport(Protocol):
    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> UpstreamResponse: ...

    async def close(self) -> None: ...


def joined(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased names, repeated fields joined with ", " (RFC 9110's combination)."""
    headers: dict[str, str] = {}
    for name, value in items:
        name = name.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def refused(status: int, headers: Mapping[str, str]) -> AttemptFailed | None:
    """Why this head is no answer the gateway can relay (None: it is one). The request
    went out and something came back, so the failure is ambiguous."""
    if status < 200:
        detail = f"the upstream answered {status} (switching protocols), not an API answer"
    elif (te := headers.get("transfer-encoding")) is not None and te.strip().lower() != "chunked":
        detail = f"the upstream framed its answer with transfer-encoding {te!r}"
    elif headers.get("content-encoding", "").strip().lower() not in DECODED:
        detail = f"the upstream encoded its answer as {headers['content-encoding']!r}"
    else:
        return None
    return AttemptFailed(Reason.BAD_RESPONSE, retryable=True, ambiguous=True, detail=detail)
