"""A browser is a hostile client: what only a web page sends is refused at the edge.

A page on any site can make its visitor's browser send requests to the gateway, which
may listen on the visitor's loopback or intranet (and, with `--no-auth`, needs no key).
Three things give such a request away, and each is refused before any route runs, the
Responses WebSocket handshake included:

- a `Host` that is not the gateway's (DNS rebinding: the page's own name, resolved to
  the gateway's address, so the browser thinks it is same-origin) -> 403
  `host_not_allowed`. Checked on requests a browser sends (an `Origin` or a
  `Sec-Fetch-Site` header) and, with `--no-auth`, on every request arriving on a
  loopback address: there every honest client says `localhost`, `127.0.0.1` or
  `[::1]`, and an old browser sending neither header would otherwise find an open
  gateway (with keys on, a rebound page has no key to send). The gateway's hosts are:
  the localhost names (`localhost`, `*.localhost`, `127.0.0.1`, `::1`), the address
  the connection arrived on (a bound `0.0.0.0` answers to each interface's address),
  and the host of each `server.allowed_origins` entry;
- an `Origin` that is neither listed in `server.allowed_origins` nor the request's own
  origin (the gateway's own status page at `/ui`) -> 403 `origin_not_allowed`;
- a body declared `text/plain`, form-encoded or multipart (the types a page may send
  cross-origin without a CORS preflight) on a JSON route -> 415
  `unsupported_media_type`, for every client: JSON routes take `application/json`.
  `POST /v1/files` (a multipart upload) is the one exception.

SDKs and curl send no `Origin` and a `Host` naming the address they dialled: untouched.
A listed origin gets CORS headers, so a page there can call the API (preflight
answered here). Cost: a request with neither `Origin` nor `Sec-Fetch-Site` and a JSON
(or no) content type (every SDK request) costs one set lookup per header, no regex, no
allocation; any other (and every request with `--no-auth`) one more pass with a dict
lookup per header, then set lookups.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from app.api.access_note import refused
from app.api.error_handlers import render
from app.errors import BrowserRefused, GatewayError, UnsupportedMediaType

_ORIGIN, _HOST, _TYPE, _FETCH, _PREFLIGHT = range(5)
_WATCHED = {
    b"origin": _ORIGIN,
    b"host": _HOST,
    b"content-type": _TYPE,
    b"sec-fetch-site": _FETCH,
    b"access-control-request-method": _PREFLIGHT,
}
_SIGNALS = frozenset({b"origin", b"sec-fetch-site", b"content-type"})
_SIMPLE_TYPES = frozenset(
    {b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"}
)
_JSON_TYPES = frozenset(
    {b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8"}
)
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
_NOT_JSON = frozenset({"/v1/files"})  # multipart uploads
_LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_FIX = (
    "a web page may call this gateway only from an origin listed in server.allowed_origins "
    "(TOKENGATE_SERVER__ALLOWED_ORIGINS)"
)


class BrowserGuard:
    def __init__(
        self, app: ASGIApp, allowed_origins: Iterable[str] = (), *, open_gateway: bool = False
    ) -> None:
        self.app = app
        self.open_gateway = open_gateway  # --no-auth: every loopback request's Host checked
        self.origins = frozenset(o.encode("latin-1") for o in allowed_origins)
        listed = {urlsplit(o).hostname for o in allowed_origins}
        self.hosts = _LOCAL_NAMES | {h for h in listed if h}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        if not self.open_gateway:
            # The fast path of SDKs and curl: no browser header, a JSON (or no) body type.
            for name, value in scope["headers"]:
                if name in _SIGNALS and (name != b"content-type" or value not in _JSON_TYPES):
                    break
            else:
                await self.app(scope, receive, send)
                return
        await self._checked(kind, scope, receive, send)

    async def _checked(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        seen: list[bytes | None] = [None, None, None, None, None]
        for name, value in scope["headers"]:
            slot = _WATCHED.get(name)
            if slot is not None:
                seen[slot] = value
        origin = seen[_ORIGIN]
        if origin is not None and origin.lower() in self.origins:
            await self._cors(origin, scope, receive, send, seen[_PREFLIGHT] is not None)
            return
        refusal = self._refusal(scope, seen)
        if refusal is None:
            await self.app(scope, receive, send)
        elif kind == "http":
            refused(scope, refusal)
            await render(refusal)(scope, receive, send)
        else:
            await _deny(scope, receive, send, refusal)

    def _refusal(self, scope: Scope, seen: list[bytes | None]) -> GatewayError | None:
        origin, host = seen[_ORIGIN], seen[_HOST]
        browser = origin is not None or seen[_FETCH] is not None
        suspect = browser or (self.open_gateway and _loopback(scope))
        if host is not None and suspect and not self._ours(host, scope):
            return BrowserRefused(
                f"Host {_shown(host)!r} is not a name of this gateway (DNS rebinding?): reach "
                "it by a localhost name or the address it listens on, or list the page's "
                "origin in server.allowed_origins (TOKENGATE_SERVER__ALLOWED_ORIGINS)",
                code="host_not_allowed",
            )
        if origin is not None and (
            host is None or origin.lower().partition(b"://")[2] != host.lower()
        ):
            return BrowserRefused(f"requests from origin {_shown(origin)!r} are refused: {_FIX}")
        content_type = seen[_TYPE]
        if (
            content_type is not None
            and scope["type"] == "http"
            and scope["method"] not in _BODYLESS
            and content_type.partition(b";")[0].strip().lower() in _SIMPLE_TYPES
            and scope["path"] not in _NOT_JSON
        ):
            return UnsupportedMediaType(
                f"Content-Type {_shown(content_type)!r} is refused on {scope['path']}: send "
                "the JSON body with `Content-Type: application/json`"
            )
        return None

    def _ours(self, host: bytes, scope: Scope) -> bool:
        text = host.decode("latin-1").lower()
        name = text[1:].partition("]")[0] if text.startswith("[") else text.partition(":")[0]
        if name in self.hosts or name.endswith(".localhost"):
            return True
        server = scope.get("server")
        return server is not None and name == server[0]

    async def _cors(
        self, origin: bytes, scope: Scope, receive: Receive, send: Send, preflight: bool
    ) -> None:
        """A listed origin: its preflight answered, its answers readable by its pages."""
        allow = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and preflight:
            asked = next(
                (v for k, v in scope["headers"] if k == b"access-control-request-headers"), b""
            )
            headers = [
                *allow,
                (b"access-control-allow-methods", b"GET, POST, PUT, DELETE, OPTIONS"),
                (b"access-control-allow-headers", asked or b"authorization, content-type"),
                (b"access-control-max-age", b"600"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exposed = (
            b"access-control-expose-headers",
            b"x-request-id, x-tokengate-domain, retry-after",
        )

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *allow, exposed]
            await send(message)

        await self.app(scope, receive, with_cors)


def _loopback(scope: Scope) -> bool:
    server = scope.get("server")
    return server is not None and (server[0] == "::1" or str(server[0]).startswith("127."))


def _shown(value: bytes) -> str:
    return value[:200].decode("latin-1")


async def _deny(scope: Scope, receive: Receive, send: Send, refusal: GatewayError) -> None:
    """The WebSocket handshake refused before it is accepted, with OpenAI's error body
    where the server can send one (the ASGI denial response), else a plain 403."""
    ws = WebSocket(scope, receive, send)
    if (await ws.receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await ws.send_denial_response(render(refusal))
    else:
        await ws.close(1008, refusal.message[:120])
