"""The gateway's own cost per request: its ASGI app driven in-process, no sockets.

    python -m tests.bench.ownpath [--mode json|sse] [--requests 20000] [--info]

`make bench` measures the whole hop (uvicorn's HTTP parsing, aiohttp, the loop, the
kernel); this takes them out. The app `tokengate serve` builds (the repo's
config.toml, one gateway key, every default feature on: auth, per-key limits, queue,
metrics, the status ring, the usage ledger in SQLite) is called with ASGI messages as
uvicorn would send them, and its upstream is a transport that answers at once with the
static upstream's bodies (`tests/bench/nginx.py`). What is left is the edge, the
pipeline, admission, dispatch, accounting, metrics and logging: the code this project
owns. Prints µs of CPU per request (best of `--rounds`); under
`valgrind --tool=callgrind` the instruction count of two runs of different lengths gives
instructions per request (see deploy/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import uvloop

from tests.bench import common, nginx, subjects
from tests.bench.procs import ROOT

_JSON = nginx.completion_body().encode()
_SSE = nginx.stream_body().encode()


class _Answer:
    """An upstream answer that has fully arrived (what a fast upstream looks like)."""

    complete = True

    def __init__(self, stream: bool) -> None:
        self.status = 200
        ctype = "text/event-stream" if stream else "application/json"
        self.headers: Mapping[str, str] = {"content-type": ctype}
        self._body = _SSE if stream else _JSON

    async def read(self) -> bytes:
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def close(self) -> None:
        return None


def _event(text: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "claude-sonnet"}
    chunk["choices"] = [{"index": 0, "delta": {"content": text}}]  # type: ignore[assignment]
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


_USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"claude-sonnet","choices":[],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":256,"total_tokens":264}}\n\n'
    b"data: [DONE]\n\n"
)


class _Events:
    """A stream whose events arrive one at a time (`--events N`), as a model's tokens do:
    each is its own read, relayed on its own; the usage and `[DONE]` come last."""

    def __init__(self, events: list[bytes]) -> None:
        self.status = 200
        self.headers: Mapping[str, str] = {"content-type": "text/event-stream"}
        self._events = events
        self.complete = False

    async def read(self) -> bytes:
        raise AssertionError("a stream is read in chunks")

    async def chunks(self) -> AsyncIterator[bytes]:
        for event in self._events:
            yield event
        self.complete = True
        yield _USAGE

    async def close(self) -> None:
        return None


class _Upstream:
    def __init__(self, pause: bool, events: int = 0) -> None:
        self.pause = pause
        self.events = [_event(f"t{i} ") for i in range(events)]  # built once, not timed

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, *, stream: bool
    ) -> _Answer:
        if self.pause:  # one turn of the loop, as a real answer takes: requests pile up
            await asyncio.sleep(0)
        if stream and self.events:
            return _Events(self.events)  # type: ignore[return-value]
        return _Answer(stream)

    async def close(self) -> None:
        return None


def _environ(work: Path, level: str) -> None:
    key: dict[str, object] = {"alias": "bench", "key_sha256": subjects.sha256(subjects.GATEWAY_KEY)}
    key |= {"requests_per_minute": subjects.HUGE_RPM, "tokens_per_minute": subjects.HUGE_TPM}
    settings = subjects.write_settings(work / "settings.json", [key])
    os.environ.update(
        TAOTOKEN_API_KEY=subjects.UPSTREAM_KEY,
        TOKENGATE_API_ENDPOINT="http://127.0.0.1:9/api",
        TOKENGATE_LOGGING__OUTPUT=str(work / "gateway.log"),
        TOKENGATE_LOGGING__LEVEL=level,
        TOKENGATE_DATABASE__PATH=str(work / "tokengate.sqlite3"),
        TOKENGATE_HEALTH_CHECK__ENABLED="false",
        TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE=str(subjects.HUGE_RPM),
        TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE=str(subjects.HUGE_TPM),
        TOKENGATE_CONFIG=str(ROOT / "config" / "config.toml"),
        TOKENGATE_SETTINGS=str(settings),
    )


def _scope(body: bytes) -> dict[str, Any]:
    headers = [
        (k.lower().encode(), v.encode()) for k, v in subjects.bearer(subjects.GATEWAY_KEY).items()
    ]
    headers += [(b"host", b"127.0.0.1:8080"), (b"content-length", str(len(body)).encode())]
    headers += [(b"user-agent", b"wrk"), (b"accept", b"*/*")]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


async def _run(
    stream: bool,
    requests: int,
    rounds: int,
    concurrency: int,
    events: int = 0,
    profile: cProfile.Profile | None = None,
) -> float:
    from app.bootstrap import load_runtime, setup_process
    from app.main import create_app
    from app.signals import tune_gc
    from tests.support.inproc import Lifespan

    runtime = load_runtime()
    setup_process(runtime)
    upstream = _Upstream(pause=concurrency > 1, events=events)
    app = create_app(runtime, transport_factory=lambda spec: upstream)
    body = common.chat_body(stream).encode()
    forever = asyncio.get_running_loop().create_future()
    statuses: dict[int, int] = {}

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await forever  # as a server does: nothing more until the client leaves
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] = statuses.get(message["status"], 0) + 1

        await app(_scope(body), receive, send)

    async def client(n: int) -> None:
        for _ in range(n):
            await one()

    async def load(n: int) -> None:
        await asyncio.gather(*(client(n // concurrency) for _ in range(concurrency)))

    best = float("inf")
    async with Lifespan(app):
        tune_gc()  # as a serving process does after start-up (app.main's lifespan)
        await load(max(200, concurrency))  # warm-up: caches, label children, ledger rows
        for _ in range(rounds):
            started = time.process_time()
            if profile is not None:
                profile.enable()
            await load(requests)
            if profile is not None:
                profile.disable()
            best = min(best, (time.process_time() - started) / requests * 1e6)
    if set(statuses) != {200}:
        raise RuntimeError(f"answers by status: {statuses}")
    return best


def _print_profile(profile: cProfile.Profile, top: int, requests: int) -> None:
    """Own time and calls per request, largest own time first (profiler-inflated times:
    compare them with each other)."""
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}({name})" if line else name
        rows.append((own, cumulative, calls, where))
    total = sum(r[0] for r in rows)
    print(f"{'own %':>6} {'cum µs':>8} {'calls':>6}  function (per request)")
    for own, cumulative, calls, where in sorted(rows, reverse=True)[:top]:
        per_call = cumulative / requests * 1e6
        print(f"{own / total:6.1%} {per_call:8.1f} {calls / requests:6.2f}  {where}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.ownpath", description=__doc__)
    p.add_argument("--mode", choices=("json", "sse"), default="json")
    p.add_argument("--requests", type=int, default=int(os.environ.get("N", "20000")))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--info", action="store_true", help="log level info (the access line on)")
    p.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=1,
        help="requests at once (above 1 each answer takes a turn of the loop, so past the "
        "domain's max_inflight they queue)",
    )
    p.add_argument(
        "--events",
        type=int,
        default=0,
        help="sse: the upstream's answer arrives as this many events, each read and relayed "
        "on its own (0: the static upstream's whole body at once)",
    )
    p.add_argument(
        "--profile",
        type=int,
        metavar="N",
        default=0,
        help="print cProfile's top N functions of the measured rounds only (no start-up, "
        "no warm-up); calls are per request",
    )
    args = p.parse_args(argv)
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="tokengate-ownpath-") as tmp:
        _environ(Path(tmp), "info" if args.info else "warning")
        run = _run(
            args.mode == "sse", args.requests, args.rounds, args.concurrency, args.events, profile
        )
        us = uvloop.run(run)
    if profile is not None:
        _print_profile(profile, args.profile, args.requests * args.rounds)
    events = f", {args.events} events an answer" if args.events else ""
    print(
        f"{args.mode} c={args.concurrency}{events}: {us:.1f} µs of CPU per request in the "
        "gateway's own code"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
