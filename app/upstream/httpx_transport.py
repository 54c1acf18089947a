"""httpx behind the `Transport` seam: the unit tests' upstream (`MockTransport`,
`ASGITransport`); production never builds it (`client.make_transport`).

Apart from `client.py` for the compiled build: its async generators (mypyc implements
none) keep this module interpreted, and `client.py` compiles.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.cause import of_exception
from app.upstream.transport import Timeouts, UpstreamResponse, joined, refused


async def once(body: bytes) -> AsyncIterator[bytes]:
    """A body read already, as the one chunk of a stream."""
    yield body


class _HttpxResponse:
    complete = False  # httpx only says so when the next read comes back empty

    def __init__(self, resp: httpx.Response, deadline: float | None) -> None:
        self._resp = resp
        self._deadline = deadline  # a non-streamed answer's total covers its body too
        self.status = resp.status_code
        self.headers = joined(resp.headers.multi_items())

    async def read(self) -> bytes:
        try:
            async with asyncio.timeout_at(self._deadline):
                return await self._resp.aread()
        except TimeoutError:
            raise _no_answer() from None
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc) from None
        finally:
            await self._resp.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc) from None

    async def close(self) -> None:
        await self._resp.aclose()


def _no_answer() -> AttemptFailed:
    return AttemptFailed(Reason.TIMEOUT, retryable=True, ambiguous=True, detail="no answer in time")


def _translate_httpx(exc: httpx.HTTPError) -> AttemptFailed:
    """Nothing was sent before a connect or pool failure; anything later is ambiguous."""
    if isinstance(exc, httpx.ConnectError | httpx.ProxyError):
        cause = of_exception(exc)
        return AttemptFailed(Reason.CONNECT, retryable=True, detail=type(exc).__name__, cause=cause)
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return AttemptFailed(Reason.TIMEOUT, retryable=True, detail="no connection in time")
    if isinstance(exc, httpx.TimeoutException):
        return _no_answer()
    if isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
        detail = f"not valid HTTP: {type(exc).__name__}"
        return AttemptFailed(Reason.BAD_RESPONSE, retryable=True, ambiguous=True, detail=detail)
    detail = type(exc).__name__
    return AttemptFailed(Reason.RESET, retryable=True, ambiguous=True, detail=detail)


class HttpxTransport:
    """Any httpx transport behind the `Transport` seam: `MockTransport` and
    `ASGITransport` in unit tests. Production never builds it (`make_transport`)."""

    def __init__(
        self,
        timeouts: Timeouts,
        total: float,
        pool_size: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._total = total
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeouts.read, connect=timeouts.connect),
            limits=httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size),
        )

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> UpstreamResponse:
        deadline = None if stream else asyncio.get_running_loop().time() + self._total
        try:
            req = self._client.build_request(method, url, headers=headers, content=body)
            async with asyncio.timeout_at(deadline):
                resp = await self._client.send(req, stream=True)
        except TimeoutError:
            raise _no_answer() from None
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc) from None
        answer = _HttpxResponse(resp, deadline)
        if (bad := refused(answer.status, answer.headers)) is not None:
            await resp.aclose()
            raise bad
        return answer

    async def close(self) -> None:
        await self._client.aclose()
