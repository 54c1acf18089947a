"""Which HTTP proxy, if any, carries the requests to an upstream origin.

The environment is read the way curl, httpx and aiohttp read it: `https_proxy` for
https:// upstreams, `http_proxy` for http:// ones, `no_proxy` for exceptions (a host, a
domain suffix, `host:port`, or `*`), each in lower or upper case with the lower-case one
winning. `NO_PROXY` matching is the standard library's (`urllib.request`), so it agrees
with what Python tools on the same node do.

`ProxyRoute.url` and `ProxyRoute.credential_for` are what both upstream clients hand aiohttp
(the HTTP transport, `aiohttp_transport.py`, and the Responses WebSocket, `websocket.py`), so an
IPv6-literal proxy or one with credentials is reached the same way by both.

It is read once, when a transport is built, so the line logged at start stays true for
the life of the process; the transport (`aiohttp_transport.py`) takes the route resolved here
rather than letting aiohttp read the environment itself. A proxy's credentials live
only in `ProxyRoute.authorization` (the Proxy-Authorization value): `shown`, the form
used in logs and errors, never carries them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit
from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]  # not in typeshed


@dataclass(frozen=True)
class ProxyRoute:
    host: str
    port: int
    shown: str  # scheme://host:port and where it came from; no credentials
    authorization: str | None = field(default=None, repr=False)
    scheme: str = "http"

    @property
    def url(self) -> str:
        """`scheme://host:port` (an IPv6 literal in brackets), for a client's `proxy=`:
        never the credentials, which travel in `headers`."""
        return f"{self.scheme}://{_bracketed(self.host)}:{self.port}"

    @property
    def headers(self) -> dict[str, str] | None:
        """The Proxy-Authorization header for the proxy, if it takes credentials."""
        return {"Proxy-Authorization": self.authorization} if self.authorization else None

    def credential_for(self, scheme: str) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        """Where the credential goes to an origin of `scheme`: (the CONNECT's headers,
        the request's own headers). aiohttp sends `proxy_headers` on a CONNECT only (an
        https:// or wss:// origin); a plain http:// or ws:// request through the proxy
        carries it among its own headers (the proxy strips it)."""
        if scheme in ("https", "wss"):
            return self.headers, None
        return None, self.headers


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Proxies:
    """Proxy settings from an environment mapping; empty means direct connections."""

    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def _get(self, name: str) -> tuple[str, str] | None:
        for key in (name, name.upper()):
            value = self.env.get(key, "").strip()
            if value:
                return key, value
        return None

    def route(self, scheme: str, host: str, port: int) -> ProxyRoute | None:
        """The proxy for requests to `scheme://host:port`, or None to connect directly."""
        found = self._get(f"{scheme}_proxy")
        if found is None:
            return None
        no_proxy = self._get("no_proxy")
        if no_proxy is not None:
            bypass = {"no": no_proxy[1]}
            name = _bracketed(host)
            # with the port for `host:port` entries; bare too, for IPv6 entries (`::1`)
            if proxy_bypass_environment(f"{name}:{port}", bypass) or (
                name != host and proxy_bypass_environment(host, bypass)
            ):
                return None
        return parse_proxy(found[1], source=found[0])


def parse_proxy(url: str, *, source: str) -> ProxyRoute:
    """A proxy URL as the environment gives it (`host:port` alone means http://)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = parts.scheme.lower()
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{source}: the proxy's port is not a number") from None
    if not parts.hostname:
        raise ValueError(f"{source}: no proxy host in the value")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return ProxyRoute(
        host=parts.hostname,
        port=port,
        shown=f"{scheme}://{_bracketed(parts.hostname)}:{port} (from {source})",
        authorization=authorization,
        scheme=scheme,
    )
