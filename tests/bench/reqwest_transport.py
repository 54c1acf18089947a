"""pyreqwest (Rust's reqwest and hyper, on tokio) behind the upstream `Transport` seam:
a measuring aid for issue #32 (tests/bench/engines.py `tokengate-pyreqwest`), not a
supported client. Its failures become `AttemptFailed` like aiohttp's do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import timedelta

from pyreqwest.client import ClientBuilder
from pyreqwest.exceptions import (
    ConnectError,
    ConnectTimeoutError,
    PoolTimeoutError,
    PyreqwestError,
    RequestTimeoutError,
)

from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.transport import Timeouts, UpstreamResponse, refused


def _translate(exc: PyreqwestError) -> AttemptFailed:
    if isinstance(exc, ConnectError):
        return AttemptFailed(Reason.CONNECT, retryable=True, detail=type(exc).__name__)
    if isinstance(exc, ConnectTimeoutError | PoolTimeoutError):
        return AttemptFailed(Reason.TIMEOUT, retryable=True, detail="no connection in time")
    if isinstance(exc, RequestTimeoutError):
        return AttemptFailed(
            Reason.TIMEOUT, retryable=True, ambiguous=True, detail="no answer in time"
        )
    return AttemptFailed(Reason.RESET, retryable=True, ambiguous=True, detail=type(exc).__name__)


class _Answer:
    complete = False

    def __init__(self, ctx: object, resp: object, headers: Mapping[str, str]) -> None:
        self._ctx = ctx
        self._resp = resp
        self.status: int = resp.status  # type: ignore[attr-defined]
        self.headers = headers
        self._closed = False

    async def read(self) -> bytes:
        try:
            data = await self._resp.body_reader.bytes()  # type: ignore[attr-defined]
            return bytes(data)
        except PyreqwestError as exc:
            raise _translate(exc) from None
        finally:
            await self.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        reader = self._resp.body_reader  # type: ignore[attr-defined]
        try:
            while (chunk := await reader.read_chunk()) is not None:
                yield bytes(chunk)
        except PyreqwestError as exc:
            raise _translate(exc) from None
        finally:
            await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._ctx.__aexit__(None, None, None)  # type: ignore[attr-defined]


class ReqwestTransport:
    def __init__(self, timeouts: Timeouts, total: float, pool_size: int) -> None:
        self._total = total
        self._client = (
            ClientBuilder()
            .connect_timeout(timedelta(seconds=timeouts.connect))
            .read_timeout(timedelta(seconds=timeouts.read))
            .max_connections(pool_size)
            .pool_max_idle_per_host(pool_size)
            .pool_idle_timeout(timedelta(seconds=4))
            .http1_only()
            .gzip(True)
            .deflate(True)
            .no_proxy()
            .build()
        )

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> UpstreamResponse:
        builder = self._client.request(method, url).headers(headers)
        if body is not None:
            builder = builder.body_bytes(body)
        if not stream:
            builder = builder.timeout(timedelta(seconds=self._total))
        ctx = builder.build_streamed()
        try:
            resp = await ctx.__aenter__()
        except PyreqwestError as exc:
            raise _translate(exc) from None
        joined: dict[str, str] = {}
        for name in resp.headers.keys():
            joined[name] = ", ".join(resp.headers.getall(name))
        answer = _Answer(ctx, resp, joined)
        if (bad := refused(answer.status, answer.headers)) is not None:
            await answer.close()
            raise bad
        return answer

    async def close(self) -> None:
        await self._client.close()
