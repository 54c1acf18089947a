"""The upstream HTTP client, behind one small interface.

    UpstreamClient.send(path, body, stream) ──► Transport.request(...) ──► UpstreamResponse
                                                   │
                                  NativeTransport  (default, `pool.py`: asyncio protocol +
                                                    httptools; the cheapest per request,
                                                    see deploy/BENCHMARKS.md)
                                  AiohttpTransport (`server.upstream_client = "aiohttp"`)
                                  HttpxTransport   (any httpx transport: MockTransport and
                                                    ASGITransport in unit tests)

Library exceptions never leave this module: they become `AttemptFailed` with a reason
(`connect`, `timeout`, `reset`; `bad_request` for a request the library refuses to
send). Upstream credentials are added in exactly one place, `upstream_headers`: the
domain's key is the only credential sent, and no client header is forwarded except a
short allowlist. Repeated response headers reach the caller joined with ", ", whatever
the client.

Proxies: `make_transport` reads HTTPS_PROXY / HTTP_PROXY / NO_PROXY once
(`proxyenv.py`) and logs, per upstream, whether it is reached directly or through
which proxy (never its credentials). The native and aiohttp transports take the same
resolved route, so both agree with each other and with the log line; httpx resolves the
environment itself (as `tokengate check`, which uses httpx, does). A proxy the native
client does not speak (anything but http://) makes that domain use aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import httpx

from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.pool import NativeTransport, parse_target
from app.upstream.proxyenv import Proxies, ProxyRoute

log = logging.getLogger("tokengate.upstream")

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
        # /v1/messages and its /count_tokens: Anthropic's credential header
        base = self._anthropic if path.startswith("/v1/messages") else self._headers
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


def joined(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased names, repeated fields joined with ", " (RFC 9110's combination)."""
    headers: dict[str, str] = {}
    for name, value in items:
        name = name.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = joined(resp.headers.items())

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
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused the CONNECT
        detail = f"proxy answered CONNECT with {exc.status}"
        return AttemptFailed(Reason.CONNECT, retryable=exc.status != 407, detail=detail)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return AttemptFailed(Reason.CONNECT, retryable=True, detail=str(exc.os_error))
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return AttemptFailed(Reason.TIMEOUT, retryable=True, detail="no answer in time")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return AttemptFailed(Reason.RESET, retryable=True, detail=type(exc).__name__)
    if isinstance(exc, ValueError):  # a header aiohttp refuses to send (a line break, ...)
        return AttemptFailed(Reason.BAD_REQUEST, retryable=False, detail="a header aiohttp refused")
    return exc


@dataclass(frozen=True)
class _AiohttpRoute:
    proxy: str | None
    connect_headers: dict[str, str] | None = field(repr=False)
    request_headers: dict[str, str] | None = field(repr=False)


class AiohttpTransport:
    """aiohttp's client. Proxies come resolved (`proxies`), not from `trust_env`: that
    would also read ~/.netrc, whose credentials aiohttp refuses to combine with the
    upstream key's Authorization header (a ValueError on every request)."""

    def __init__(
        self,
        timeouts: Timeouts,
        total: float,
        pool_size: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        proxies: Proxies | None = None,
    ) -> None:
        self._timeouts = timeouts
        self._total = total
        self._pool_size = pool_size
        self._ssl: ssl.SSLContext | bool = ssl_context or True
        self._proxies = proxies or Proxies()
        self._routes: dict[str, _AiohttpRoute] = {}
        self._session: aiohttp.ClientSession | None = None

    def _route(self, url: str) -> _AiohttpRoute:
        found = self._routes.get(url)
        if found is None:
            scheme, host, port = parse_target(url).origin
            route = self._proxies.route(scheme, host, port)
            if route is None:
                found = _AiohttpRoute(None, None, None)
            else:
                auth = {"Proxy-Authorization": route.authorization} if route.authorization else None
                proxy = f"{route.scheme}://{_authority(route)}"
                # aiohttp sends `proxy_headers` on a CONNECT only; a plain-http request
                # through the proxy carries the credential among its own headers.
                if scheme == "https":
                    found = _AiohttpRoute(proxy, auth, None)
                else:
                    found = _AiohttpRoute(proxy, None, auth)
            if len(self._routes) < 256:  # a handful of base URLs x paths in practice
                self._routes[url] = found
        return found

    def _get(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop (each worker has its own).
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._pool_size,
                limit_per_host=0,
                ttl_dns_cache=60,
                keepalive_timeout=30,
                ssl=self._ssl,
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
        # `connect` is aiohttp's wait for a pool slot plus the connect: the slot wait is
        # bounded by the read timeout, as the native pool's and httpx's are.
        timeout = aiohttp.ClientTimeout(
            total=None if stream else self._total,
            connect=t.read + t.connect,
            sock_connect=t.connect,
            sock_read=t.read,
        )
        try:
            route = self._route(url)
            if route.request_headers is not None:
                headers = {**headers, **route.request_headers}
            resp = await self._get().request(
                method,
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                proxy=route.proxy,
                proxy_headers=route.connect_headers,
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

    def __init__(self, resp: httpx.Response, deadline: float | None) -> None:
        self._resp = resp
        self._deadline = deadline  # a non-streamed answer's total covers its body too
        self.status = resp.status_code
        self.headers = {k.lower(): v for k, v in resp.headers.items()}  # repeats joined

    async def read(self) -> bytes:
        try:
            async with asyncio.timeout_at(self._deadline):
                return await self._resp.aread()
        except TimeoutError:
            raise AttemptFailed(
                Reason.TIMEOUT, retryable=True, detail="no answer in time"
            ) from None
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
        return AttemptFailed(Reason.CONNECT, retryable=True, detail=type(exc).__name__)
    if isinstance(exc, httpx.TimeoutException):
        return AttemptFailed(Reason.TIMEOUT, retryable=True, detail="no answer in time")
    return AttemptFailed(Reason.RESET, retryable=True, detail=type(exc).__name__)


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
        deadline = None if stream else asyncio.get_running_loop().time() + self._total
        try:
            req = self._client.build_request(method, url, headers=headers, content=body)
            async with asyncio.timeout_at(deadline):
                resp = await self._client.send(req, stream=True)
        except TimeoutError:
            raise AttemptFailed(
                Reason.TIMEOUT, retryable=True, detail="no answer in time"
            ) from None
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc) from None
        return _HttpxResponse(resp, deadline)

    async def close(self) -> None:
        await self._client.aclose()


def make_transport(
    kind: str,
    timeouts: Timeouts,
    total: float,
    pool_size: int,
    *,
    base: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Transport:
    """The configured client for one upstream (`base`), proxied as the environment says
    (`env`, default the process's), and one log line saying how it is reached."""
    proxies = Proxies(dict(os.environ if env is None else env))
    route = None
    if base is not None:
        origin = parse_target(base).origin
        route = proxies.route(*origin)
        _log_route(base, route, kind, proxies)
        if kind == "native" and route is not None and route.scheme != "http":
            log.warning(
                "upstream %s: the native client speaks only http:// proxies; using aiohttp",
                base,
            )
            kind = "aiohttp"
    if kind == "httpx":
        return HttpxTransport(timeouts, total, pool_size)
    if kind == "aiohttp":
        return AiohttpTransport(timeouts, total, pool_size, proxies=proxies)
    return NativeTransport(timeouts.connect, timeouts.read, total, pool_size, proxies=proxies)


def _log_route(base: str, route: ProxyRoute | None, kind: str, proxies: Proxies) -> None:
    if route is not None:
        how = "CONNECT tunnel" if base.startswith("https:") else "absolute-form requests"
        auth = ", with Proxy-Authorization" if route.authorization else ""
        log.info("upstream %s: via proxy %s (%s%s; %s client)", base, route.shown, how, auth, kind)
    elif any(k.lower() in ("http_proxy", "https_proxy") for k in proxies.env):
        log.info("upstream %s: direct (NO_PROXY, or no proxy for its scheme)", base)


def _authority(route: ProxyRoute) -> str:
    host = f"[{route.host}]" if ":" in route.host else route.host
    return f"{host}:{route.port}"
