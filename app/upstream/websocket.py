"""An upstream's own Responses WebSocket mode, for requests that came over the gateway's.

A domain with `responses_websocket = true` is reached, for requests of a client
WebSocket connection, over a WebSocket of its own: one `UpstreamSockets` per client
connection holds at most one upstream socket per domain (opened on first use with the
domain's key, reused for every later request the pipeline sends there, closed with the
client connection). Everything else about a request is unchanged: the pipeline's limits,
queue, retries, fallback and accounting see an `UpstreamResponse` (`SocketAnswer`) whose
chunks are the upstream's frames, one event's JSON each, as they came: the pipeline's
answer relays them in its frame mode (`app.pipeline.answer.frames`), reading usage, the first
token and the end of the response from each event, and the client's socket gets the
very bytes the upstream sent (no SSE on the way). What a socket's cache holds is the
`Turn` of `turns.py`, the model the client's session keeps too.

    send(body) ──► this socket's last completed response is a prefix of body.input
                   (its input + its output items)?
                     yes: `previous_response_id` + only the new items (the upstream's
                          connection-local cache holds the rest, as OpenAI documents)
                     no:  the whole input
              ──► first frame an `error`: the answer's status and body (429 throttles,
                  5xx retries, 4xx is relayed); `previous_response_not_found` or
                  `websocket_connection_limit_reached` after an incremental send: the
                  upstream lost its cache, so the request goes again whole, once, on a
                  fresh socket
              ──► else 200: frames relayed as they came until the terminal event

A socket that breaks or goes silent after a `response.create` was sent is an ambiguous
failure (the upstream may be generating): by the gateway's resend rule it is not sent
again. An upstream that refuses the upgrade (426, 404...) is remembered per client connection:
`send` answers None and the pipeline uses HTTP + SSE for that domain. aiohttp is this
module's library (its own session, proxies from the environment like the HTTP client's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.proxyenv import Proxies
from app.upstream.turns import Recorder, Turn

log = logging.getLogger("tokengate.upstream")
BETA = "responses_websockets=2026-02-06"  # what Codex CLI 0.171 sends on its upgrade
_STALE = frozenset({"previous_response_not_found", "websocket_connection_limit_reached"})


def _event(raw: bytes) -> dict[str, Any] | None:
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def incremental(last: Turn | None, body: dict[str, Any]) -> dict[str, Any]:
    """The `response.create` for `body` on a socket whose cache holds `last`, the last
    turn completed on it (pure)."""
    message = {k: v for k, v in body.items() if k not in ("stream", "background")}
    message["type"] = "response.create"
    items = body.get("input")
    if last is None or not isinstance(items, list) or "previous_response_id" in body:
        return message
    known = [*last.items, *last.output]
    if len(items) > len(known) and items[: len(known)] == known:
        message["previous_response_id"] = last.response_id
        message["input"] = items[len(known) :]
    return message


class SocketDialer:
    """Opens upstream sockets; one aiohttp session for the whole gateway."""

    def __init__(self, connect_timeout: float, read_timeout: float, env: Mapping[str, str]):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.proxies = Proxies(dict(env))
        self._session: aiohttp.ClientSession | None = None

    async def open(self, spec: DomainSpec) -> aiohttp.ClientWebSocketResponse | None:
        """A socket to `spec`'s upstream, or None if it refuses the WebSocket mode."""
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        parts = urlsplit(spec.api_base)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        url = ("wss" if scheme == "https" else "ws") + spec.api_base[len(scheme) :]
        headers = {
            "authorization": f"Bearer {spec.api_key.get_secret_value()}",
            "openai-beta": BETA,
        }
        route = self.proxies.route(scheme, host, port)
        proxy, auth = None, None
        if route is not None:
            proxy, (auth, own) = route.url, route.credential_for(scheme)
            headers.update(own or {})  # a ws:// upgrade carries it itself (no CONNECT)
        try:
            return await self._session.ws_connect(
                url + "/v1/responses",
                headers=headers,
                proxy=proxy,
                proxy_headers=auth,
                max_msg_size=0,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise AttemptFailed(
                    Reason.UPSTREAM_AUTH, retryable=False, status=exc.status
                ) from None
            log.warning(
                "domain %s: the upstream answered %s to a Responses WebSocket; "
                "its requests go over HTTP (set responses_websocket = false)",
                spec.name,
                exc.status,
            )
            return None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise AttemptFailed(Reason.CONNECT, retryable=True, detail=type(exc).__name__) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass
class _Link:
    ws: aiohttp.ClientWebSocketResponse
    last: Turn | None = None


@dataclass
class UpstreamSockets:
    """The upstream sockets of one client connection, one per domain at most."""

    dialer: SocketDialer
    _links: dict[str, _Link] = field(default_factory=dict)
    _refused: set[str] = field(default_factory=set)

    async def send(self, spec: DomainSpec, raw: bytes) -> SocketAnswer | None:
        """The upstream's answer to the HTTP body `raw`; None: use HTTP for this domain."""
        if spec.name in self._refused:
            return None
        body = orjson.loads(raw)
        for fresh in (False, True):
            link = await self._link(spec, fresh)
            if link is None:
                self._refused.add(spec.name)
                return None
            message = incremental(None if fresh else link.last, body)
            answer = await self._exchange(spec, link, message, body)
            if fresh or not answer.stale:
                return answer
        raise AssertionError("unreachable")

    async def _link(self, spec: DomainSpec, fresh: bool) -> _Link | None:
        link = self._links.get(spec.name)
        if link is not None and (fresh or link.ws.closed):
            await self._drop(spec.name)
            link = None
        if link is None:
            ws = await self.dialer.open(spec)
            if ws is None:
                return None
            link = self._links[spec.name] = _Link(ws)
        return link

    async def _exchange(
        self, spec: DomainSpec, link: _Link, message: dict[str, Any], body: dict[str, Any]
    ) -> SocketAnswer:
        try:
            await link.ws.send_str(orjson.dumps(message).decode())
        except (aiohttp.ClientError, OSError, ConnectionError) as exc:
            await self._drop(spec.name)
            raise AttemptFailed(
                Reason.RESET, retryable=True, ambiguous=True, detail=str(exc)
            ) from None
        answer = SocketAnswer(self, spec.name, link, body.get("input"), self.dialer.read_timeout)
        await answer.start()
        return answer

    async def _drop(self, name: str) -> None:
        link = self._links.pop(name, None)
        if link is not None and not link.ws.closed:
            await link.ws.close()

    async def close(self) -> None:
        for name in list(self._links):
            await self._drop(name)


class SocketAnswer:
    """One response read from an upstream socket, as an `UpstreamResponse` whose chunks
    are its frames (one event each)."""

    def __init__(
        self, owner: UpstreamSockets, domain: str, link: _Link, items: Any, timeout: float
    ) -> None:
        self.status = 200
        self.headers: dict[str, str] = {}
        self.complete = False
        self.stale = False
        self._owner, self._domain, self._link = owner, domain, link
        self._turn = Recorder(items if isinstance(items, list) else [])
        self._timeout = timeout
        self._raw = b""
        self._error: dict[str, Any] = {}

    async def start(self) -> None:
        """Read the first frame: an error makes this answer a failing status."""
        self._raw = await self._frame()
        first = _event(self._raw)
        if first is None or first.get("type") != "error":
            return
        self.complete = True
        status = first.get("status") or first.get("status_code")
        self.status = status if isinstance(status, int) and status >= 400 else 500
        error = first.get("error")
        self.stale = isinstance(error, dict) and error.get("code") in _STALE
        self._error = error if isinstance(error, dict) else {"message": "upstream error"}
        headers = first.get("headers")
        if isinstance(headers, dict):
            self.headers = {str(k).lower(): str(v) for k, v in headers.items()}
        self.headers["content-type"] = "application/json"

    async def _frame(self) -> bytes:
        try:
            msg = await self._link.ws.receive(timeout=self._timeout)
        except TimeoutError:
            await self._owner._drop(self._domain)
            raise AttemptFailed(
                Reason.TIMEOUT, retryable=True, ambiguous=True, detail="websocket"
            ) from None
        if msg.type is aiohttp.WSMsgType.TEXT:
            return str(msg.data).encode()
        if msg.type is aiohttp.WSMsgType.BINARY:
            return bytes(msg.data)
        await self._owner._drop(self._domain)
        raise AttemptFailed(
            Reason.RESET, retryable=True, ambiguous=True, detail=f"websocket {msg.type.name}"
        )

    async def read(self) -> bytes:
        return orjson.dumps({"error": self._error})

    async def chunks(self) -> AsyncIterator[bytes]:
        """Each frame, one event's JSON, as it came, until the terminal event; the turn
        it makes is what this socket's cache holds next."""
        raw, turn = self._raw, self._turn
        while True:
            turn.see(raw)
            if turn.ended:
                self.complete = True
                self._link.last = turn.turn()
            yield raw
            if self.complete:
                return
            raw = await self._frame()

    async def close(self) -> None:
        if not self.complete:  # the client left mid-answer: closing cancels the upstream's work
            await asyncio.shield(self._owner._drop(self._domain))
