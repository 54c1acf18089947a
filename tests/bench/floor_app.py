"""The floor under tokengate: the same server and client libraries with nothing of its own.

Two ASGI apps for `uvicorn` (uvloop, httptools, no access log, as `tokengate serve`
runs it), measured as the `floor-*` subjects beside tokengate and nginx:

- `canned`: answers every request with the static upstream's chat completion (or, with
  `FLOOR_CANNED=sse`, its stream, in one piece), without an upstream: what uvicorn alone
  costs a request;
- `relay`: reads the body and sends it to `FLOOR_UPSTREAM` with one aiohttp session
  (keep-alive, no cookie jar) and the client's `Authorization`, then relays the status,
  content type and body, streaming or not: what uvicorn plus aiohttp cost, with no
  auth, limits, queue, accounting, metrics or logging.

Neither is a usable proxy (no error handling, no header hygiene); they bound from below
what any gateway built on these libraries can reach.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

from tests.bench import nginx

_SSE = os.environ.get("FLOOR_CANNED") == "sse"
_BODY = (nginx.stream_body() if _SSE else nginx.completion_body()).encode()
_TYPE = b"text/event-stream" if _SSE else b"application/json"
_HEAD = [(b"content-type", _TYPE), (b"content-length", str(len(_BODY)).encode())]

Scope = dict[str, Any]


async def canned(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
    await send({"type": "http.response.body", "body": _BODY})


class _Relay:
    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.upstream = os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:9")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.session is None:
            self.session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        # The client's credential goes through as it came (as nginx-proxy passes it).
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), b"Bearer sk-floor")
        headers = {"content-type": "application/json", "authorization": auth.decode()}
        url = self.upstream + scope["path"]
        async with self.session.post(url, data=b"".join(chunks), headers=headers) as resp:
            ctype = resp.headers.get("content-type", "application/json").encode()
            if ctype.startswith(b"text/event-stream"):
                head = [(b"content-type", ctype)]
                await send({"type": "http.response.start", "status": resp.status, "headers": head})
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            body = await resp.read()
        head = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": resp.status, "headers": head})
        await send({"type": "http.response.body", "body": body})


relay = _Relay()
