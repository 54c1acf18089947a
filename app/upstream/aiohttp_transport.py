"""The upstream HTTP client: aiohttp, wrapped once (the only module that imports it).

One `AiohttpTransport` per domain owns one `ClientSession` and its `TCPConnector`:

- **pool**: `limit` connections (the domain's `max_inflight` plus headroom for probes);
  idle connections are dropped after `KEEPALIVE_SEC`, below the idle timeouts common
  upstream servers close at (uvicorn, vLLM and Node.js: 5 s; nginx 75 s), so the gateway
  drops an idle connection before the upstream does and the race "closed as the request
  went out" is rare: when it happens the request is not sent again (below);
- **DNS** answers are cached `DNS_TTL_SEC`; several addresses are dialled with happy
  eyeballs (RFC 8305: families interleaved, the next address after 250 ms), which
  aiohttp does with its own sockets, so it works on uvloop too;
- no cookie jar (an API has none, and the jar costs per request), no redirects followed
  (a gateway relays a 3xx, it does not turn a POST into a GET), no proxy from the
  environment by aiohttp itself (`proxyenv` resolves it once: `trust_env` would also read
  ~/.netrc, whose credentials aiohttp refuses to combine with the upstream key);
- bodies are decoded when an upstream compresses despite `accept-encoding: identity`,
  since the relay reads and rewrites them (`transport.refused` turns away what cannot be
  decoded); heads are bounded by aiohttp's parser: 8190 bytes a line, 128 fields.

The resend rule is the caller's (`retry.RetrySpec.may_resend`); this module states the
fact it needs. A failure before any byte of the request was written (DNS, connect,
proxy, TLS, a pool wait: aiohttp's connector errors) is `ambiguous=False`; one after
(the connection broke, went silent, or answered something that is not HTTP) is
`ambiguous=True`. aiohttp itself re-sends only idempotent methods (GET, the health
probe), once, on a kept-alive connection that died: never a POST.

Timeouts: `connect` bounds DNS, TCP, proxy tunnel and TLS (`sock_connect`); the wait
for a pool slot plus the connect is bounded by `read + connect`; `read` is the longest
silence while an answer is owed (`sock_read`: a paused read, waiting on a slow client,
is not silence; once a stream's body is handed over, one watch per domain bounds its
silence instead of a timer moved per read: `_Quiet`); `total` bounds a whole
non-streamed exchange, body included. A stream is read as it arrives: aiohttp stops
reading from the socket while about 128 KiB (twice `read_bufsize`) wait unread, so a
slow client slows its upstream instead of growing the gateway's memory.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, overload

import aiohttp
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDictProxy
from yarl import URL

from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.cause import Cause, of_exception
from app.upstream.proxyenv import Proxies
from app.upstream.transport import Timeouts, UpstreamResponse, refused

KEEPALIVE_SEC = 4.0
DNS_TTL_SEC = 60
HAPPY_EYEBALLS_DELAY = 0.25  # RFC 8305's connection attempt delay
READ_BUFSIZE = 64 * 1024
# aiohttp adds a User-Agent and an Accept-Encoding of its own to a request without them;
# the gateway's requests carry both (`client.upstream_headers`), and asking aiohttp to
# skip them anyway costs a copy of the headers per request, so it is asked only when one
# is missing.
_OWN_HEADERS = frozenset({"user-agent", "accept-encoding"})
_NOT_ADDED = ("User-Agent", "Accept-Encoding")
# Python before 3.12.8 can leak an aborted TLS transport (cpython#118960): aiohttp's
# cleanup closes them; later versions fixed it and aiohttp warns if asked.
T = TypeVar("T")
_CLEANUP_CLOSED = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)


@dataclass(frozen=True)
class _Route:
    """One upstream URL, parsed once, and how it is reached."""

    url: URL
    proxy: str | None = None
    via: str = ""  # " (via proxy http://host:port (from HTTPS_PROXY))"; never credentials
    connect_headers: dict[str, str] | None = field(default=None, repr=False)
    request_headers: dict[str, str] | None = field(default=None, repr=False)


class AiohttpTransport:
    """The production `Transport` (see the module docstring)."""

    def __init__(
        self,
        timeouts: Timeouts,
        total: float,
        pool_size: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        proxies: Proxies | None = None,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self._pool_size = pool_size
        # None: aiohttp's default context (the system store as it was at import)
        self._ssl: ssl.SSLContext | bool = ssl_context or True
        self._proxies = proxies or Proxies()
        self._resolver = resolver
        self._routes: dict[str, _Route] = {}
        self._session: aiohttp.ClientSession | None = None
        # no read timeout (0), no watch: as aiohttp's `sock_read`, which then sets no timer
        self._quiet = _Quiet(timeouts.read) if timeouts.read > 0 else None
        t = timeouts
        wait = t.read + t.connect  # a pool slot, then the connect
        self._timeout = {
            stream: aiohttp.ClientTimeout(
                total=None if stream else total,
                connect=wait,
                sock_read=t.read,
                sock_connect=t.connect,
            )
            for stream in (False, True)
        }

    def _route(self, url: str) -> _Route:
        found = self._routes.get(url)
        if found is None:
            found = self._resolve(URL(url))
            if len(self._routes) < 256:  # a handful of base URLs x paths in practice
                self._routes[url] = found
        return found

    def _resolve(self, url: URL) -> _Route:
        if url.scheme not in ("http", "https") or not url.host or url.port is None:
            raise AttemptFailed(Reason.BAD_REQUEST, retryable=False, detail="not an http(s) URL")
        route = self._proxies.route(url.scheme, url.host, url.port)
        if route is None:
            return _Route(url)
        connect, own = route.credential_for(url.scheme)
        via = f" (via proxy {route.shown})"
        return _Route(url, route.url, via, connect_headers=connect, request_headers=own)

    def _get(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop (each worker has its own).
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._pool_size,
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_SEC,
                ttl_dns_cache=DNS_TTL_SEC,
                happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY,
                interleave=1,
                enable_cleanup_closed=_CLEANUP_CLOSED,
                resolver=self._resolver,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                read_bufsize=READ_BUFSIZE,
                raise_for_status=False,
            )
        return self._session

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> UpstreamResponse:
        route = self._routes.get(url) or self._route(url)
        if route.request_headers is not None:
            headers = {**headers, **route.request_headers}
        try:
            resp = await self._get().request(
                method,
                route.url,
                data=body,
                headers=headers,
                skip_auto_headers=None if headers.keys() >= _OWN_HEADERS else _NOT_ADDED,
                timeout=self._timeout[stream],
                proxy=route.proxy,
                proxy_headers=route.connect_headers,
                allow_redirects=False,
            )
        except BaseException as exc:
            raise failure_of(exc, route.via) from None
        answer = _Response(resp, self._quiet if stream else None)
        if (bad := refused(answer.status, answer.headers)) is not None:
            resp.close()  # never back to the pool: its framing is not to be trusted
            raise bad
        return answer

    async def close(self) -> None:
        if self._quiet is not None:
            self._quiet.close()
        if self._session is not None:
            await self._session.close()


class _Headers(Mapping[str, str]):
    """An answer's head as the pipeline reads it (`transport.joined`'s view: names in any
    case, a repeated field as its values joined with ", "), over aiohttp's multidict
    without copying it: a request reads a handful of fields of a head that, from a
    hosted API, has twenty or more."""

    __slots__ = ("_raw",)

    def __init__(self, raw: CIMultiDictProxy[str]) -> None:
        self._raw = raw

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    @overload
    def get(self, name: str, /) -> str | None: ...
    @overload
    def get(self, name: str, /, default: str | T) -> str | T: ...
    def get(self, name: str, /, default: object = None) -> object:
        values = self._raw.getall(name, None)
        if values is None:
            return default
        return values[0] if len(values) == 1 else ", ".join(values)

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter({name.lower(): None for name in self._raw})

    def __len__(self) -> int:
        return len({name.lower() for name in self._raw})


class _Response:
    __slots__ = ("_quiet", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, quiet: _Quiet | None = None) -> None:
        self._resp = resp
        self._quiet = quiet
        self.status = resp.status
        self.headers = _Headers(resp.headers)

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except BaseException as exc:
            self._resp.close()
            raise failure_of(exc) from None
        finally:
            self._resp.release()

    @property
    def complete(self) -> bool:
        return self._resp.content.at_eof()

    def chunks(self) -> AsyncIterator[bytes]:
        chunks = _Chunks(self._resp)
        if self._quiet is not None and (conn := self._resp.connection) is not None:
            # the body's silence is bounded by the watch from here on (see `_Quiet`)
            assert conn.protocol is not None
            conn.protocol.read_timeout = None
            self._quiet.watch(chunks)
        return chunks

    async def close(self) -> None:
        # release(): a fully read answer returns its connection to the pool; an unfinished
        # one (client gone, stream cut) closes it, which is how the upstream learns to
        # stop generating.
        self._resp.release()
        if self._quiet is not None:
            self._quiet.drop(self._resp)


class _Chunks:
    """The answer's body as it arrives, each read a chunk (`readany`), aiohttp's errors as
    the pipeline's. One iterator object over the stream rather than a generator around
    aiohttp's own iterator: a streamed answer resumes it once per event, and each layer
    of that chain was a measurable share of the relay's CPU per event
    (deploy/BENCHMARKS.md, "The hot path")."""

    __slots__ = ("_content", "_resp", "quiet_for", "seen", "waiting")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._content = resp.content
        self.waiting = False  # awaiting the upstream's next bytes (`_Quiet` counts then)
        self.seen = -1  # the body's raw bytes at the watch's last tick
        self.quiet_for = 0.0  # seconds of silence counted by the watch

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        self.waiting = True
        try:
            chunk = await self._content.readany()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._resp.close()
            raise failure_of(exc) from None
        finally:
            self.waiting = False
        if not chunk:
            raise StopAsyncIteration
        return chunk

    def received(self) -> int:
        """The body's bytes so far, as they came on the wire."""
        return self._content.total_raw_bytes

    def ended(self) -> bool:
        return self._content.at_eof() or self._content.exception() is not None

    def silent(self) -> None:
        """The watch found the upstream silent for the read timeout: the wait ends as
        aiohttp's own `sock_read` would end it."""
        self._content.set_exception(aiohttp.SocketTimeoutError("no data from the upstream"))


class _Quiet:
    """The read timeout of streamed bodies, for all of a domain's streams at once.

    aiohttp bounds silence (`sock_read`) by moving a loop timer on every read: a new
    timer and a cancelled one per SSE event, about 5,800 instructions of the 69,500 an
    event cost (8 %; deploy/BENCHMARKS.md, issue #32's third pass). Once a stream's
    head and body are handed over (`chunks`), its connection's timer is switched off and
    this watch ticks instead, every `step` (a tenth of the read timeout, at most 1 s),
    only while streams are open: a stream whose reader awaits the upstream and whose
    body gained no byte over ticks adding up to the read timeout fails with the same
    timeout, at most two steps late. A reader that is not waiting (relaying to a slow
    client; aiohttp then pauses the socket) is never silent, as with `sock_read`."""

    __slots__ = ("_handle", "_streams", "read", "step")

    def __init__(self, read: float) -> None:
        self.read = read
        self.step = min(1.0, read / 10)
        self._streams: dict[aiohttp.ClientResponse, _Chunks] = {}
        self._handle: asyncio.TimerHandle | None = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._streams.clear()

    def drop(self, resp: aiohttp.ClientResponse) -> None:
        """The stream was closed (read to its end, or given up)."""
        self._streams.pop(resp, None)

    def watch(self, chunks: _Chunks) -> None:
        self._streams[chunks._resp] = chunks
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.step, self._tick)

    def _tick(self) -> None:
        for resp, chunks in list(self._streams.items()):
            if chunks.ended():
                del self._streams[resp]
                continue
            raw = chunks.received()
            if raw != chunks.seen or not chunks.waiting:
                chunks.seen, chunks.quiet_for = raw, 0.0
                continue
            chunks.quiet_for += self.step
            if chunks.quiet_for >= self.read:
                del self._streams[resp]
                chunks.silent()
        self._handle = (
            asyncio.get_running_loop().call_later(self.step, self._tick) if self._streams else None
        )


def failure_of(exc: BaseException, via: str = "") -> BaseException:
    """aiohttp's exception as the pipeline's `AttemptFailed` (cancellation and our own
    failures pass through). The connector's errors come before any byte of the request
    was written; everything after is ambiguous."""
    if isinstance(exc, AttemptFailed | asyncio.CancelledError):
        return exc
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused the CONNECT
        detail = f"proxy answered CONNECT with {exc.status}{via}"
        return AttemptFailed(Reason.CONNECT, retryable=exc.status != 407, detail=detail)
    if isinstance(exc, aiohttp.ClientConnectorError):  # DNS, refused, TLS, proxy unreachable
        cause = Cause.TLS if isinstance(exc, aiohttp.ClientSSLError) else of_exception(exc)
        detail = f"{exc}"[:200] + via
        return AttemptFailed(Reason.CONNECT, retryable=True, detail=detail, cause=cause)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # a pool slot or the connect
        detail = f"no connection in time{via}"
        return AttemptFailed(Reason.TIMEOUT, retryable=True, detail=detail, cause=Cause.TIMEOUT)
    if isinstance(exc, TimeoutError):  # sock_read (ServerTimeoutError) or total
        return _ambiguous(Reason.TIMEOUT, "no answer in time")
    if isinstance(exc, aiohttp.ClientResponseError):  # the parser refused the answer's head
        return _ambiguous(Reason.BAD_RESPONSE, f"not valid HTTP: {exc.message}"[:200])
    if isinstance(exc, aiohttp.ClientError | OSError):
        return _ambiguous(Reason.RESET, type(exc).__name__)
    if isinstance(exc, ValueError):  # a header aiohttp refuses to send (a line break, ...)
        return AttemptFailed(Reason.BAD_REQUEST, retryable=False, detail="a header aiohttp refused")
    return exc


def _ambiguous(reason: Reason, detail: str) -> AttemptFailed:
    return AttemptFailed(reason, retryable=True, ambiguous=True, detail=detail)
