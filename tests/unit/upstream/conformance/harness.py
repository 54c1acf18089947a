"""The conformance harness: a client, the gateway, and a raw-socket scripted upstream.

    httpx client ──HTTP──► gateway (create_app under uvicorn, the shipped aiohttp
                           transport) ──HTTP──► Upstream (tests.support.loopback: plays
                           the bytes a case scripts, records every request it read)

Each case asserts what the gateway's client sees (status, body, stream events,
`x-should-retry`) and how many times the upstream saw the request (`Through.sent`).
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson

from app.main import create_app
from app.runtime import compile_runtime
from tests.support.inproc import local_settings
from tests.support.loopback import Upstream
from tests.support.scrape import metric_sum
from tests.support.served import Served

MODEL = "m-1"
UPSTREAM_KEY = "sk-conformance-upstream"
PING = {"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}}],
        "usage": USAGE,
    }
)


def event(content: str | None = None, *, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    chunk: dict[str, Any] = {"object": "chat.completion.chunk", "model": MODEL, "choices": choices}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


STREAM = [event("po"), event("ng"), event(usage=USAGE), b"data: [DONE]\n\n"]


def head(status: str = "200 OK", *fields: str) -> bytes:
    lines = "".join(field + "\r\n" for field in fields)
    return f"HTTP/1.1 {status}\r\n{lines}\r\n".encode()


def answer(body: bytes = ANSWER, *fields: str) -> bytes:
    """A JSON answer framed by Content-Length."""
    return (
        head("200 OK", "content-type: application/json", f"content-length: {len(body)}", *fields)
        + body
    )


def deltas(text: str) -> str:
    """The content a client read from an SSE body, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                out.append(choice.get("delta", {}).get("content") or "")
    return "".join(out)


def stream_error(text: str) -> str | None:
    """The code of the error event that ended a relayed stream, if one did."""
    for line in text.splitlines():
        if line.startswith("data: {") and '"error"' in line:
            code: str | None = json.loads(line[6:])["error"]["code"]
            return code
    return None


class Through:
    """The gateway under test and a client of it."""

    def __init__(self, served: Served, client: httpx.AsyncClient, upstreams: list[Upstream]):
        self.served = served
        self.client = client
        self.upstreams = upstreams

    async def chat(self, **extra: Any) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", json={**PING, **extra})

    def sent(self, up: Upstream | None = None) -> int:
        """How many times the upstream read the chat request (health probes aside)."""
        ups = [up] if up is not None else self.upstreams
        return sum(r.startswith(b"POST /v1/chat/completions ") for u in ups for r in u.requests)

    async def metric(self, name: str, **labels: str) -> float:
        return metric_sum((await self.client.get("/metrics")).text, name, **labels)


def settings_for(bases: list[str], **overrides: Any) -> dict[str, Any]:
    """One domain per upstream base URL, each serving the model; fast retries."""
    data: dict[str, Any] = {
        "model_route": {"default": MODEL},
        "token_scheduler": {"timeout_ms": 2000, "connect_timeout_ms": 1000},
        "retry_policy": {"backoff_ms": 1, "max_backoff_ms": 1, "max_attempts": 3},
        "scale_up": [
            {"domain": f"d{n}", "api_base": base, "models": [MODEL]} for n, base in enumerate(bases)
        ],
    }
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return data


async def start(
    stack: AsyncExitStack, home: Path, upstreams: list[Upstream], bases: list[str], **overrides: Any
) -> Through:
    runtime = compile_runtime(
        local_settings(home, settings_for(bases, **overrides)),
        {"TAOTOKEN_API_KEY": UPSTREAM_KEY},
        no_auth=True,
    )
    served = await stack.enter_async_context(Served(create_app(runtime)))
    client = await stack.enter_async_context(
        # trust_env=False: the proxy variables some cases set are the gateway's, not ours
        httpx.AsyncClient(base_url=served.url, timeout=10, trust_env=False)
    )
    return Through(served, client, upstreams)
