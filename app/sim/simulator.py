"""`tokengate sim`: an honest OpenAI-compatible upstream for demos, tests and benchmarks.

Honest means it refuses what the real API refuses: a missing or wrong key (401), an
unknown model (404 `model_not_found`), malformed bodies (400), traffic past its own
quota (429 with `Retry-After` and `retry-after-ms`, see quota.py) and an empty
balance (429 `insufficient_quota`). Answers are deterministic, with
usage counted its own way. It also records what it received (`GET /_sim/records`),
so tests can assert which key, headers and bodies reached it, and counts concurrent
requests and the usage it billed for answers sent whole (`GET /_sim/stats`). Faults are
set by flags or `PUT /_sim/faults`. A request that demands a tool or names one it offers
is answered with a tool call (`tools.py`), and a prompt cache per simulator (`cache.py`)
reports the cached part of each prompt, as a domain's upstream would;
`DELETE /_sim/records` also empties it.
The `/_sim/*` control routes have no auth: bind the simulator to loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import asdict, fields
from fnmatch import fnmatchcase
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from app.sim import shapes
from app.sim.cache import PromptCache
from app.sim.knobs import Faults, SimKnobs, StreamDropped, T, paced
from app.sim.messages import count_tokens_body
from app.sim.quota import Quota
from app.sim.refusals import SimError
from app.sim.responses_routes import Renderers, ResponsesSim

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"


class Sim:
    def __init__(self, knobs: SimKnobs) -> None:
        self.knobs = knobs
        self.rng = random.Random(knobs.seed)
        self.records: deque[dict[str, Any]] = deque(maxlen=knobs.max_records)
        self.quota = Quota(
            knobs.rpm, knobs.tpm, knobs.quota_window_sec, knobs.quota_mode, knobs.balance
        )
        self.inflight = 0
        self.peak_inflight = 0
        self.counts: dict[str, int] = {}
        self.cache = PromptCache(knobs.cache_entries, knobs.cache_min_tokens)
        # Usage of the answers sent whole: what an honest upstream bills (the ledger's
        # e2e tests compare against it).
        self.billed = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._seq = 0

    # -- bookkeeping --------------------------------------------------------------
    def record(self, request: Request, body: Any) -> dict[str, Any]:
        """The record of an HTTP request (`GET /_sim/records` lists them)."""
        return self._keep(
            {
                "path": request.url.path,
                "query": request.url.query,
                "method": request.method,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body,
            }
        )

    def record_socket(self, headers: Mapping[str, str], body: Any) -> dict[str, Any]:
        """The record of one message on a Responses WebSocket."""
        return self._keep(
            {
                "path": "/v1/responses",
                "method": "WEBSOCKET",
                "body": body,
                "headers": {k.lower(): v for k, v in headers.items()},
            }
        )

    def _keep(self, fields: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        rec: dict[str, Any] = {
            "seq": self._seq,
            **fields,
            "status": None,
            "cancelled": False,
            "completed": False,
            "at": time.time(),
        }
        if self.knobs.record:
            self.records.append(rec)
        return rec

    def _bill(self, job: shapes.SimReply) -> None:
        self.billed["requests"] += 1
        self.billed["prompt_tokens"] += job.prompt_tokens
        self.billed["completion_tokens"] += job.completion_tokens

    def count(self, status: int) -> None:
        self.counts[str(status)] = self.counts.get(str(status), 0) + 1

    # -- checks ---------------------------------------------------------------------
    def authorize(self, request: Request, anthropic: bool) -> None:
        presented = request.headers.get("x-api-key") if anthropic else None
        if not presented:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            presented = value.strip() if scheme.lower() == "bearer" else ""
        if not presented:
            raise SimError(
                401, "You didn't provide an API key.", "invalid_request_error", "missing_api_key"
            )
        if self.knobs.api_key is not None and presented != self.knobs.api_key:
            raise SimError(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )

    def _betas(self, request: Request) -> None:
        """A strict upstream (`betas` set): an `anthropic-beta` value it does not know is a
        400 naming it, in the words Anthropic's API uses."""
        known = self.knobs.betas
        sent = request.headers.get("anthropic-beta")
        if known is None or not sent:
            return
        unknown = [
            v
            for v in (p.strip() for p in sent.split(","))
            if v and not any(fnmatchcase(v, k) for k in known)
        ]
        if unknown:
            listed = ", ".join(f"`{v}`" for v in unknown)
            raise SimError(
                400,
                f"Unexpected value(s) {listed} for the `anthropic-beta` header. Please consult "
                "our documentation at docs.anthropic.com or try again without the header.",
                "invalid_request_error",
            )

    def model_for(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise SimError(400, "you must provide a model parameter", "invalid_request_error")
        if model not in self.knobs.models:
            raise SimError(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            )
        return model

    def admit(self, tokens: int) -> None:
        if self.quota.exhausted:
            raise SimError(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            )
        now = time.monotonic()
        wait = self.quota.take(tokens, now)
        if wait is not None:
            headers = {}
            if self.knobs.quota_headers != "none":
                headers = {
                    "retry-after": str(max(1, int(wait + 0.999))),
                    "retry-after-ms": str(max(1, int(wait * 1000 + 0.999))),
                    **self.rate_headers(now),
                }
            raise SimError(
                429,
                f"Rate limit reached; please try again in {wait:.3f}s.",
                "requests",
                "rate_limit_exceeded",
                headers,
            )

    def rate_headers(self, now: float) -> dict[str, str]:
        return self.quota.headers(now) if self.knobs.quota_headers == "full" else {}

    async def served(
        self, request: Request, rec: dict[str, Any], admitted: int, spent: int
    ) -> tuple[dict[str, str], Faults | None]:
        """What every generating route does once the request is valid: its injected faults,
        admission of `admitted` tokens against the limits, `spent` from the quota, the
        configured latency; then it counts as a 200. Its rate headers, and the fault that
        resets the answer (if one was drawn)."""
        reset = await self.faults(request, rec)
        self.admit(admitted)
        headers = self.rate_headers(time.monotonic())
        self.quota.spend(spent)
        if self.knobs.latency_ms:
            await self.wait(request, self.knobs.latency_ms / 1000, rec)
        rec["status"] = 200
        self.count(200)
        return headers, reset

    async def faults(self, request: Request, rec: dict[str, Any]) -> Faults | None:
        f = self.knobs.faults
        if not f.applies(request.url.path):
            return None
        if f.stall_ms:
            await self.wait(request, f.stall_ms / 1000, rec)
        if f.hold:
            await self._held(request, rec)
        if f.should_fail(self.rng):
            if f.reset:
                return f
            headers = {}
            if f.retry_after is not None:
                headers = {
                    "retry-after": str(max(0, int(f.retry_after + 0.999))),
                    "retry-after-ms": str(int(f.retry_after * 1000)),
                }
            raise SimError(f.status, f"injected fault ({f.status})", "server_error", None, headers)
        return None

    async def _held(self, request: Request, rec: dict[str, Any]) -> None:
        """Until the hold is lifted: a test lines requests up behind the upstream, looks at
        the gateway's queues, then lets them go, with no clock to race."""
        while self.knobs.faults.hold:
            await asyncio.sleep(0.01)
            if await request.is_disconnected():
                rec["cancelled"] = True
                raise asyncio.CancelledError

    async def wait(self, request: Request, seconds: float, rec: dict[str, Any]) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.02))
            if await request.is_disconnected():
                rec["cancelled"] = True
                raise asyncio.CancelledError

    # -- the endpoint ---------------------------------------------------------------------
    async def _received(self, request: Request) -> tuple[Any, dict[str, Any]]:
        """The request's JSON body (None if it is not JSON) and its record."""
        raw = await request.body()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        rec = self.record(request, body)
        rec["raw_sha256"] = hashlib.sha256(raw).hexdigest()  # to compare bytes, not values
        return body, rec

    async def handle(self, request: Request) -> Response:
        anthropic = request.url.path == MESSAGES
        body, rec = await self._received(request)
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        handed_off = False
        try:
            self.authorize(request, anthropic)
            self._betas(request)
            if not isinstance(body, dict):
                raise SimError(
                    400,
                    "We could not parse the JSON body of your request.",
                    "invalid_request_error",
                )
            model = self.model_for(body)
            job = shapes.build(request.url.path, body, model, self.knobs, self.cache)
            spent = job.prompt_tokens + job.completion_tokens
            headers, reset = await self.served(request, rec, job.quota_tokens, spent)
            if reset is not None:
                return _Truncated(orjson.dumps(job.json_body())[:20])
            if job.stream:
                handed_off = True
                return _Stream(self._stream(job, rec), headers)
            if self.knobs.tokens_per_sec:
                await self.wait(request, job.completion_tokens / self.knobs.tokens_per_sec, rec)
            rec["completed"] = True
            self._bill(job)
            return Response(
                orjson.dumps(job.json_body()), headers=headers, media_type="application/json"
            )
        except SimError as err:
            rec["status"] = err.status
            self.count(err.status)
            return _error(err, anthropic)
        finally:
            if not handed_off:
                self.inflight -= 1

    async def streamed(
        self, events: Iterable[tuple[T, bool]], rec: dict[str, Any]
    ) -> AsyncIterator[T]:
        """A stream's events as the knobs pace them (`paced`), recording in `rec` how it
        ended (`completed`, or `cancelled` when the client left) and giving back its
        in-flight place however it ends: every streamed answer of the sim goes through here."""
        try:
            async for event in paced(events, self.knobs):
                yield event
            rec["completed"] = True
        except asyncio.CancelledError:
            rec["cancelled"] = True
            raise
        finally:
            self.inflight -= 1

    async def _stream(self, job: shapes.SimReply, rec: dict[str, Any]) -> AsyncIterator[bytes]:
        async for event in self.streamed(job.events(), rec):
            yield event
        self._bill(job)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's `POST /v1/messages/count_tokens`: free, never against the quota."""
        body, rec = await self._received(request)
        try:
            self.authorize(request, anthropic=True)
            self._betas(request)
            if not isinstance(body, dict):
                raise SimError(400, "We could not parse the JSON body.", "invalid_request_error")
            self.model_for(body)
            prompt = shapes.read_prompt("messages", body)
        except SimError as err:
            rec["status"] = err.status
            self.count(err.status)
            return _error(err, True)
        rec["status"], rec["completed"] = 200, True
        self.count(200)
        return Response(
            orjson.dumps(count_tokens_body(prompt.tokens)), media_type="application/json"
        )

    # -- control plane ----------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        try:
            self.authorize(request, anthropic=False)
        except SimError as err:
            return _error(err, False)
        data = [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "sim"}
            for m in self.knobs.models
        ]
        return Response(
            orjson.dumps({"object": "list", "data": data}), media_type="application/json"
        )

    async def get_records(self, request: Request) -> Response:
        path = request.query_params.get("path")
        recs = [r for r in self.records if path is None or r["path"] == path]
        return Response(orjson.dumps(recs, default=str), media_type="application/json")

    async def clear(self, request: Request) -> Response:
        self.records.clear()
        self.counts.clear()
        self.cache = PromptCache(self.knobs.cache_entries, self.knobs.cache_min_tokens)
        self.billed = dict.fromkeys(self.billed, 0)
        self.peak_inflight = self.inflight
        return Response(b"{}", media_type="application/json")

    async def set_faults(self, request: Request) -> Response:
        data = orjson.loads(await request.body() or b"{}")
        names = {f.name for f in fields(Faults)}
        unknown = set(data) - names
        if unknown:
            return Response(
                orjson.dumps({"error": f"unknown fault fields: {sorted(unknown)}"}), 400
            )
        if "paths" in data:
            data["paths"] = tuple(data["paths"])
        self.knobs.faults = Faults(**data)
        return Response(orjson.dumps(asdict(self.knobs.faults)), media_type="application/json")

    async def set_quota(self, request: Request) -> Response:
        """`{"balance": N}`: the account's prepaid tokens (null: unlimited), e.g. a top-up."""
        data = orjson.loads(await request.body() or b"{}")
        if set(data) - {"balance"}:
            return Response(orjson.dumps({"error": "only 'balance' can be set"}), 400)
        self.quota.balance = data.get("balance")
        return Response(
            orjson.dumps({"balance": self.quota.balance}), media_type="application/json"
        )

    async def stats(self, request: Request) -> Response:
        return Response(
            orjson.dumps(
                {
                    "inflight": self.inflight,
                    "peak_inflight": self.peak_inflight,
                    "statuses": self.counts,
                    "records": len(self.records),
                    "cancelled": sum(1 for r in self.records if r["cancelled"]),
                    "balance": self.quota.balance,
                    "billed": self.billed,
                }
            ),
            media_type="application/json",
        )


class _Stream(Response):
    """SSE whose generator may raise `StreamDropped`: the connection then ends without its
    last chunk."""

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            *((k.encode(), v.encode()) for k, v in headers.items()),
        ]
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        stream_task = asyncio.ensure_future(self._pump(send))
        watch_task = asyncio.ensure_future(_until_disconnect(receive))
        done, _ = await asyncio.wait({stream_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stream_task, watch_task):
            if task not in done:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, StreamDropped):
                    pass
        if stream_task in done and stream_task.exception() is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> None:
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        except StreamDropped:
            return None  # leave the response unfinished: the server drops the connection
        except OSError:
            return None


class _Truncated(Response):
    """Announces a body, sends part of it, and stops: a connection reset mid-answer."""

    def __init__(self, partial: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"application/json"), (b"content-length", b"4096")]
        self.partial = partial

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.partial, "more_body": True})


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _error(err: SimError, anthropic: bool) -> Response:
    if anthropic:
        kinds = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
        body: dict[str, Any] = {
            "type": "error",
            "error": {
                "type": kinds.get(
                    err.status, "api_error" if err.status >= 500 else "invalid_request_error"
                ),
                "message": err.message,
            },
        }
    else:
        body = {
            "error": {"message": err.message, "type": err.kind, "param": None, "code": err.code}
        }
    return Response(orjson.dumps(body), err.status, err.headers, media_type="application/json")


def create_sim_app(knobs: SimKnobs) -> Starlette:
    sim = Sim(knobs)
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    if knobs.anthropic:
        paths.append(MESSAGES)
    routes: list[BaseRoute] = [Route(p, sim.handle, methods=["POST"]) for p in paths]
    if knobs.anthropic:
        routes.append(Route(COUNT_TOKENS, sim.count_tokens, methods=["POST"]))
    responses = ResponsesSim(sim, Renderers(_Stream, _Truncated, lambda err: _error(err, False)))
    routes += [
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/input_tokens", responses.input_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"]),
        Route("/v1/responses/{response_id}/input_items", responses.input_items, methods=["GET"]),
    ]
    if knobs.responses_websocket:
        routes.append(WebSocketRoute("/v1/responses", responses.socket))
    routes += [
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/_sim/records", sim.get_records, methods=["GET"]),
        Route("/_sim/records", sim.clear, methods=["DELETE"]),
        Route("/_sim/faults", sim.set_faults, methods=["PUT"]),
        Route("/_sim/quota", sim.set_quota, methods=["PUT"]),
        Route("/_sim/stats", sim.stats, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.sim = sim
    return app
