"""The upstream client, behind one small interface.

    UpstreamClient.send(path, body, stream) ──► Transport.request(...) ──► UpstreamResponse
                                                   │
                                  AiohttpTransport (`aiohttp_transport.py`: production, always)
                                  HttpxTransport   (`httpx_transport.py`: any httpx transport,
                                                    MockTransport and ASGITransport in tests)

Library exceptions never leave a transport: they become `AttemptFailed` with a reason
(`connect`, `timeout`, `reset`, `bad_response`; `bad_request` for a request the library
refuses to send) and whether the upstream may have acted on the request (`ambiguous`).
Upstream credentials are added in exactly one place, `upstream_headers`: the domain's
key is the only credential sent, and no client header is forwarded except a short
allowlist, whose comma-list values go as the domain's policy says (`betas.py`: a 400
refusing a named beta is sent again once without it, inside `send`). Repeated response
headers reach the caller joined with ", ", whatever the client.

Proxies: `make_transport` reads HTTPS_PROXY / HTTP_PROXY / NO_PROXY once
(`proxyenv.py`) and logs, per upstream, whether it is reached directly or through
which proxy (never its credentials); the transport takes that same resolved route, so
it agrees with the log line. httpx resolves the environment itself (as `tokengate
check`, which uses httpx, does).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from urllib.parse import urlsplit

import orjson

from app.log import redacted_url
from app.runtime import DomainSpec
from app.upstream.aiohttp_transport import AiohttpTransport
from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.betas import HeaderPolicies
from app.upstream.httpx_transport import once
from app.upstream.proxyenv import Proxies, ProxyRoute
from app.upstream.responses_chat import to_chat
from app.upstream.responses_chat_stream import ChatAnswer
from app.upstream.transport import Timeouts, Transport, UpstreamResponse

log = logging.getLogger("tokengate.upstream")

USER_AGENT = "tokengate/0.1"
RESPONSES, CHAT = "/v1/responses", "/v1/chat/completions"
# Client headers that carry API semantics the upstream needs; nothing else is forwarded.
FORWARDED = frozenset({b"anthropic-version", b"anthropic-beta", b"openai-beta"})


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
        # the relay reads every body; one that comes compressed anyway is decoded
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
    }
    if anthropic:
        headers["x-api-key"] = key
        headers["anthropic-version"] = "2023-06-01"
    else:
        headers["authorization"] = f"Bearer {key}"
    return headers


# Told of each value an upstream refused and that was sent again without: (domain, header).
OnRefused = Callable[[str, str], None]


class UpstreamClient:
    """One pooled client per domain."""

    def __init__(
        self, domain: DomainSpec, transport: Transport, on_refused: OnRefused | None = None
    ) -> None:
        self.domain = domain
        self.transport = transport
        self.on_refused = on_refused
        self.policies = HeaderPolicies(domain.headers)
        self._headers = upstream_headers(domain)
        self._anthropic = upstream_headers(domain, anthropic=True)

    def rekey(self, domain: DomainSpec) -> None:
        """Use a rotated upstream key from the next request on (SIGHUP reload), and the
        domain's header policy if it changed."""
        if domain.headers != self.domain.headers:
            self.policies.reconfigure(domain.headers)
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
        if path == RESPONSES and self.domain.responses == "chat" and body is not None:
            return await self._on_chat(body, stream, request_id, client_headers)
        # /v1/messages and its /count_tokens: Anthropic's credential header
        base = self._anthropic if path.startswith("/v1/messages") else self._headers
        headers = {**base, "x-request-id": request_id}
        if client_headers:
            # Allowlisted API-semantics headers only; they can never replace the credential.
            headers.update(
                (k, v) for k, v in client_headers.items() if k not in ("x-api-key", "authorization")
            )
            self.policies.outgoing(headers)
        if body is None:
            headers.pop("content-type")
        url = self.domain.api_base + path
        resp = await self.transport.request(method, url, headers, body, stream=stream)
        if resp.status != 400 or not client_headers:
            return resp
        return await self._refused(resp, method, url, headers, body, stream)

    async def _on_chat(
        self,
        body: bytes,
        stream: bool,
        request_id: str,
        client_headers: Mapping[str, str] | None,
    ) -> UpstreamResponse:
        """A Responses request to an upstream that speaks only chat completions: sent as
        one, answered as the Responses API would (`responses_chat.py`)."""
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise AttemptFailed(Reason.BAD_REQUEST, retryable=False, detail="not JSON") from None
        chat, tools = to_chat(request)
        resp = await self.send(
            CHAT,
            orjson.dumps(chat),
            stream=stream,
            request_id=request_id,
            client_headers=client_headers,
        )
        return ChatAnswer(resp, request, tools)

    async def _refused(
        self,
        resp: UpstreamResponse,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None,
        stream: bool,
    ) -> UpstreamResponse:
        """A 400 that names header values sent (a beta the upstream does not know): sent
        again once without them. Any other 400 is returned as it came (read already)."""
        data = await resp.read()
        refused = self.policies.refused(headers, data)
        if not refused:
            return Answered(resp.status, resp.headers, data)
        self.policies.learn(refused)
        for name, values in refused.items():
            log.warning(
                "domain %s refused %s value(s) %s: sent again without them, and dropped from "
                "its later requests until a reload",
                self.domain.name,
                name,
                ", ".join(values),
            )
            if self.on_refused is not None:
                self.on_refused(self.domain.name, name)
        self.policies.without(headers, refused)
        return await self.transport.request(method, url, headers, body, stream=stream)

    async def close(self) -> None:
        await self.transport.close()


class Answered:
    """An answer whose body was read already (to look into a 400), handed on as one."""

    complete = True

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status, self.headers, self._body = status, headers, body

    async def read(self) -> bytes:
        return self._body

    def chunks(self) -> AsyncIterator[bytes]:
        return once(self._body)

    async def close(self) -> None:
        return None


def make_transport(
    timeouts: Timeouts,
    total: float,
    pool_size: int,
    *,
    base: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Transport:
    """The client for one upstream (`base`), proxied as the environment says (`env`,
    default the process's), and one log line saying how it is reached."""
    proxies = Proxies(dict(os.environ if env is None else env))
    context = None
    if base is not None:
        parts = urlsplit(base)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        _log_route(base, proxies.route(scheme, host, port), proxies)
        if scheme == "https":
            # The system trust store as it is at start (SSL_CERT_FILE / SSL_CERT_DIR
            # included), loaded now rather than on the event loop at the first request.
            context = ssl.create_default_context()
    return AiohttpTransport(timeouts, total, pool_size, ssl_context=context, proxies=proxies)


def _log_route(base: str, route: ProxyRoute | None, proxies: Proxies) -> None:
    if route is not None:
        how = "CONNECT tunnel" if base.startswith("https:") else "absolute-form requests"
        auth = ", with Proxy-Authorization" if route.authorization else ""
        log.info("upstream %s: via proxy %s (%s%s)", redacted_url(base), route.shown, how, auth)
    elif any(k.lower() in ("http_proxy", "https_proxy") for k in proxies.env):
        log.info("upstream %s: direct (NO_PROXY, or no proxy for its scheme)", redacted_url(base))
