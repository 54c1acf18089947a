"""The upstream HTTP client, behind one small interface.

    UpstreamClient.send(path, body, stream) ──► Transport.request(...) ──► UpstreamResponse
                                                   │
                                  NativeTransport  (default, `pool.py`: asyncio protocol +
                                                    httptools; measured fastest by far)
                                  AiohttpTransport (`server.upstream_client = "aiohttp"`)
                                  HttpxTransport   (any httpx transport: MockTransport and
                                                    ASGITransport in unit tests)

Library exceptions never leave this module: they become `AttemptFailed` with a reason
(`connect`, `timeout`, `reset`). Upstream credentials are added in exactly one place,
`upstream_headers`: the domain's key is the only credential sent, and no client
header is forwarded except a short allowlist.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed
from app.upstream.pool import NativeTransport

USER_AGENT = "tokengate/0.1"
# Client headers that carry API semantics the upstream needs; nothing else is forwarded.
FORWARDED = frozenset({b"anthropic-version", b"anthropic-beta", b"openai-beta"})


@dataclass(frozen=True)
class Timeouts:
    connect: float
    read: float


class UpstreamResponse(Protocol):
    status: int
    headers: dict[str, str]

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


def forwardable(raw_headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The allowlisted client headers (ASGI raw form in); usually none."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers if k in FORWARDED}


def upstream_headers(domain: DomainSpec, *, anthropic: bool = False) -> dict[str, str]:
    """The domain's credential and fixed headers: the only place a key is put on the wire.

    Anthropic's Messages API takes the key in `x-api-key`; OpenAI's in a bearer token."""
    key = domain.api_key.get_secret_value()
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "accept-encoding": "identity",  # the relay reads and forwards bytes as they are
        "user-agent": USER_AGENT,
    }
    if anthropic:
        headers["x-api-key"] = key
        headers["anthropic-version"] = "2023-06-01"
    else:
        headers["authorization"] = f"Bearer {key}"
    return headers


class UpstreamClient:
    """One pooled client per domain."""

    def __init__(self, domain: DomainSpec, transport: Transport) -> None:
        self.domain = domain
        self.transport = transport
        self._headers = upstream_headers(domain)
        self._anthropic = upstream_headers(domain, anthropic=True)

    def rekey(self, domain: DomainSpec) -> None:
        """Use a rotated upstream key from the next request on (SIGHUP reload)."""
        self.domain = domain
        self._headers = upstream_headers(domain)
        self._anthropic = upstream_headers(domain, anthropic=True)

    async def send(
        self,
        path: str,
        body: bytes | None,
        *,
        stream: bool,
        request_id: str,
        method: str = "POST",
        client_headers: Mapping[str, str] | None = None,
    ) -> UpstreamResponse:
        base = self._anthropic if path == "/v1/messages" else self._headers
        headers = {**base, "x-request-id": request_id}
        if client_headers:
            # Allowlisted API-semantics headers only; they can never replace the credential.
            headers.update(
                (k, v) for k, v in client_headers.items() if k not in ("x-api-key", "authorization")
            )
        if body is None:
            headers.pop("content-type")
        url = self.domain.api_base + path
        return await self.transport.request(method, url, headers, body, stream=stream)

    async def close(self) -> None:
        await self.transport.close()


# -- aiohttp ------------------------------------------------------------------------


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.headers.items()}

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except BaseException as exc:
            self._resp.close()
            raise _translate_aiohttp(exc) from None
        finally:
            self._resp.release()

    @property
    def complete(self) -> bool:
        return self._resp.content.at_eof()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._resp.close()
            raise _translate_aiohttp(exc) from None

    async def close(self) -> None:
        # release(): a fully read answer returns its connection to the pool; an unfinished
        # one (client gone, stream cut) closes it, which cancels the upstream generation.
        self._resp.release()


def _translate_aiohttp(exc: BaseException) -> BaseException:
    if isinstance(exc, AttemptFailed | asyncio.CancelledError):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError):
        return AttemptFailed("connect", retryable=True, detail=str(exc.os_error))
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return AttemptFailed("timeout", retryable=True, detail="no answer in time")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return AttemptFailed("reset", retryable=True, detail=type(exc).__name__)
    return exc


class AiohttpTransport:
    def __init__(self, timeouts: Timeouts, total: float, pool_size: int) -> None:
        self._timeouts = timeouts
        self._total = total
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _get(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop (each worker has its own).
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._pool_size, limit_per_host=0, ttl_dns_cache=60, keepalive_timeout=30
            )
            # No cookie jar (an API has no cookies, and the jar costs per request) and no
            # compression: the relay reads SSE events, and loopback/LAN bytes are cheap.
            self._session = aiohttp.ClientSession(
                connector=connector,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                raise_for_status=False,
            )
        return self._session

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> UpstreamResponse:
        t = self._timeouts
        timeout = aiohttp.ClientTimeout(
            total=None if stream else self._total, sock_connect=t.connect, sock_read=t.read
        )
        try:
            resp = await self._get().request(
                method, url, data=body, headers=headers, timeout=timeout
            )
        except BaseException as exc:
            raise _translate_aiohttp(exc) from None
        return _AiohttpResponse(resp)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


# -- httpx ---------------------------------------------------------------------------


class _HttpxResponse:
    complete = False  # httpx only says so when the next read comes back empty

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers = {k.lower(): v for k, v in resp.headers.items()}

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
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


def _translate_httpx(exc: httpx.HTTPError) -> AttemptFailed:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return AttemptFailed("connect", retryable=True, detail=type(exc).__name__)
    if isinstance(exc, httpx.TimeoutException):
        return AttemptFailed("timeout", retryable=True, detail="no answer in time")
    return AttemptFailed("reset", retryable=True, detail=type(exc).__name__)


class HttpxTransport:
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
        req = self._client.build_request(method, url, headers=headers, content=body)
        try:
            if stream:
                resp = await self._client.send(req, stream=True)
            else:
                async with asyncio.timeout(self._total):
                    resp = await self._client.send(req, stream=True)
        except TimeoutError:
            raise AttemptFailed("timeout", retryable=True, detail="no answer in time") from None
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc) from None
        return _HttpxResponse(resp)

    async def close(self) -> None:
        await self._client.aclose()


def make_transport(kind: str, timeouts: Timeouts, total: float, pool_size: int) -> Transport:
    if kind == "httpx":
        return HttpxTransport(timeouts, total, pool_size)
    if kind == "aiohttp":
        return AiohttpTransport(timeouts, total, pool_size)
    return NativeTransport(timeouts.connect, timeouts.read, total, pool_size)
