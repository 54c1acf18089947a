"""The simulator's Responses API: `POST /v1/responses` (JSON and the typed SSE stream),
the stored responses of this simulator instance, `input_tokens`.

Honest where a gateway could go wrong:
- `previous_response_id` must name a response stored by *this* instance (`store`
  defaults to true), else 400 `previous_response_not_found`: two simulators behind one
  gateway show whether a follow-up reached the domain that created its predecessor;
- a `function_call_output` must answer a call made earlier in the conversation, else
  400: a gateway that dropped earlier items (WebSocket mode) is caught;
- `background: true` answers `queued` at once, is `in_progress` for a while and then
  done (`--background-ms`), can be cancelled meanwhile, and is polled with GET;
- usage is spent from the same quota and balance as every other route.

Answers and usage are built in `response_shapes.py`; the fault knobs, quota, records
and key checks are the simulator's own (`simulator.Sim`), reached through its public
surface, `Host`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.sim import response_shapes as shapes
from app.sim.knobs import Faults, SimKnobs, T
from app.sim.quota import Quota
from app.sim.refusals import SimError

MAX_STORED = 10_000
MAX_CACHED_PREFIXES = 1_000


class Host(Protocol):
    """What the Responses API uses of the simulator (`simulator.Sim`): its knobs, quota and
    counters, its records, and the checks every route makes."""

    knobs: SimKnobs
    quota: Quota
    inflight: int
    peak_inflight: int

    def record(self, request: Request, body: Any) -> dict[str, Any]: ...
    def record_socket(self, headers: Mapping[str, str], body: Any) -> dict[str, Any]: ...
    def count(self, status: int) -> None: ...
    def authorize(self, request: Request, anthropic: bool) -> None: ...
    def model_for(self, body: dict[str, Any]) -> str: ...
    def admit(self, tokens: int) -> None: ...
    async def served(
        self, request: Request, rec: dict[str, Any], admitted: int, spent: int
    ) -> tuple[dict[str, str], Faults | None]: ...
    def streamed(
        self, events: Iterable[tuple[T, bool]], rec: dict[str, Any]
    ) -> AsyncIterator[T]: ...


@dataclass(frozen=True)
class Renderers:
    """How the server answers (its classes, injected to avoid a circular import)."""

    stream: Callable[[AsyncIterator[bytes], dict[str, str]], Response]
    truncated: Callable[[bytes], Response]
    error: Callable[[SimError], Response]


@dataclass
class Stored:
    final: dict[str, Any]
    items: list[dict[str, Any]]  # this response's own input, with ids (input_items)
    context: list[Any]  # the conversation a follow-up continues: everything so far
    queued_until: float = 0.0
    ready_at: float = 0.0
    cancelled: bool = field(default=False)

    def view(self, now: float) -> dict[str, Any]:
        if self.cancelled:
            return shapes.snapshot(self.final, "cancelled")
        if now >= self.ready_at:
            return self.final
        return shapes.snapshot(self.final, "queued" if now < self.queued_until else "in_progress")


class ResponsesSim:
    def __init__(
        self, sim: Host, render: Renderers, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sim = sim
        self.render = render
        self.clock = clock
        self.stored: OrderedDict[str, Stored] = OrderedDict()
        self.prefixes: OrderedDict[str, list[bytes]] = OrderedDict()  # prompt_cache_key

    # -- POST /v1/responses -----------------------------------------------------------------
    async def create(self, request: Request) -> Response:
        sim = self.sim
        raw = await request.body()
        body = _json(raw)
        rec = sim.record(request, body)
        rec["raw_sha256"] = hashlib.sha256(raw).hexdigest()
        sim.inflight += 1
        sim.peak_inflight = max(sim.peak_inflight, sim.inflight)
        handed_off = False
        try:
            sim.authorize(request, False)
            if not isinstance(body, dict):
                raise shapes.bad("We could not parse the JSON body of your request.")
            model = sim.model_for(body)
            plan, stored = self._plan(body, model)
            limit = body.get("max_output_tokens") or sim.knobs.reply_tokens
            spent = plan.prompt + plan.output_tokens
            headers, reset = await sim.served(request, rec, plan.prompt + limit, spent)
            if reset is not None:
                return self.render.truncated(orjson.dumps(plan.response)[:20])
            self._keep(body, stored)
            background = body.get("background") is True
            if body.get("stream") is True:
                handed_off = True
                stream = self._stream(plan.response, rec, queued=background)
                return self.render.stream(stream, headers)
            rec["completed"] = True
            view = stored.view(self.clock()) if background else plan.response
            return Response(orjson.dumps(view), headers=headers, media_type="application/json")
        except SimError as err:
            rec["status"] = err.status
            sim.count(err.status)
            return self.render.error(err)
        finally:
            if not handed_off:
                sim.inflight -= 1

    def _plan(
        self, body: dict[str, Any], model: str, local: dict[str, Stored] | None = None
    ) -> tuple[shapes.Plan, Stored]:
        context, cached = self._context(body, local)
        items = shapes.input_items(body)
        shapes.check_outputs(context, items)
        if body.get("background") is True and body.get("store") is False:
            raise shapes.bad("Background responses require store=true.")
        cached = max(cached, self._prefix_hit(body, [*context, *items]))
        knobs = self.sim.knobs
        plan = shapes.plan(
            body, model, context, items, cached, knobs.reply_tokens, knobs.tool_calls
        )
        output = plan.response["output"]
        whole = [*context, *items, *output]
        key = body.get("prompt_cache_key")
        if isinstance(key, str):
            self.prefixes[key] = shapes.fingerprint(whole)
            self.prefixes.move_to_end(key)
            while len(self.prefixes) > MAX_CACHED_PREFIXES:
                self.prefixes.popitem(last=False)
        stored = Stored(plan.response, _with_ids(items), whole)
        if body.get("background") is True and body.get("stream") is not True:
            now, span = self.clock(), self.sim.knobs.background_ms / 1000
            stored.queued_until, stored.ready_at = now + span / 3, now + span
        return plan, stored

    def _context(
        self, body: dict[str, Any], local: dict[str, Stored] | None = None
    ) -> tuple[list[Any], int]:
        """The conversation continued from `previous_response_id` (this WebSocket's own
        responses first, when there is one) and its tokens (what a prompt cache holds)."""
        previous = body.get("previous_response_id")
        if previous is None:
            return [], 0
        stored = None
        if isinstance(previous, str):
            stored = (local or {}).get(previous) or self.stored.get(previous)
        if stored is None or stored.cancelled:
            raise shapes.bad(
                f"Previous response with id '{str(previous)[:200]}' not found.",
                "previous_response_not_found",
            )
        return stored.context, shapes.items_tokens(stored.context)

    def _prefix_hit(self, body: dict[str, Any], whole: list[Any]) -> int:
        """Tokens of the leading items this `prompt_cache_key` saw last time."""
        key = body.get("prompt_cache_key")
        before = self.prefixes.get(key) if isinstance(key, str) else None
        if not before:
            return 0
        now = shapes.fingerprint(whole)
        same = 0
        while same < min(len(now), len(before)) and now[same] == before[same]:
            same += 1
        return shapes.items_tokens(whole[:same])

    def _keep(self, body: dict[str, Any], stored: Stored) -> None:
        if body.get("store") is False:
            return
        self.stored[stored.final["id"]] = stored
        while len(self.stored) > MAX_STORED:
            self.stored.popitem(last=False)

    async def _stream(
        self, final: dict[str, Any], rec: dict[str, Any], *, queued: bool = False, after: int = -1
    ) -> AsyncIterator[bytes]:
        seq = -1
        async for event in self.sim.streamed(shapes.events(final, queued=queued), rec):
            seq += 1
            if seq > after:
                yield shapes.sse(event, seq)

    # -- the WebSocket mode (--responses-websocket) --------------------------------------------
    async def socket(self, ws: WebSocket) -> None:
        """`response.create` frames answered one at a time with the stream's events, one
        per frame; the connection keeps every response it made, stored or not (OpenAI's
        connection-local cache), so a request may send only its new items."""
        if not self._socket_key_ok(ws):
            await ws.close(1008, "Incorrect API key provided.")
            return
        await ws.accept()
        local: dict[str, Stored] = {}
        try:
            async for text in ws.iter_text():
                for frame in await self._socket_turn(ws, text, local):
                    await ws.send_text(frame)
        except WebSocketDisconnect:
            return

    def _socket_key_ok(self, ws: WebSocket) -> bool:
        scheme, _, value = ws.headers.get("authorization", "").partition(" ")
        presented = value.strip() if scheme.lower() == "bearer" else ""
        wanted = self.sim.knobs.api_key
        return bool(presented) and (wanted is None or presented == wanted)

    async def _socket_turn(self, ws: WebSocket, text: str, local: dict[str, Stored]) -> list[str]:
        sim = self.sim
        body = _json(text.encode())
        rec = sim.record_socket(ws.headers, body)
        try:
            if not isinstance(body, dict) or body.get("type") != "response.create":
                raise shapes.bad("send 'response.create' events")
            warm = body.get("generate") is False
            body = {k: v for k, v in body.items() if k not in ("type", "generate", "stream")}
            model = sim.model_for(body)
            plan, stored = self._plan(body, model, local)
            if warm:  # a warm-up: an id for its input, nothing generated, nothing billed
                _warm_up(plan, stored)
            else:
                limit = body.get("max_output_tokens") or sim.knobs.reply_tokens
                sim.admit(plan.prompt + limit)
                sim.quota.spend(plan.prompt + plan.output_tokens)
        except SimError as err:
            rec["status"] = err.status
            sim.count(err.status)
            error = {"type": err.kind, "code": err.code, "message": err.message}
            frame = {"type": "error", "status": err.status, "error": error, "headers": err.headers}
            return [orjson.dumps(frame).decode()]
        rec["status"], rec["completed"] = 200, True
        sim.count(200)
        local[plan.response["id"]] = stored
        self._keep(body, stored)
        events = shapes.events(plan.response)
        return [
            orjson.dumps({**e, "sequence_number": n}).decode() for n, (e, _) in enumerate(events)
        ]

    # -- stored responses --------------------------------------------------------------------
    def _find(self, request: Request) -> Stored:
        self.sim.authorize(request, False)
        response_id = request.path_params["response_id"]
        stored = self.stored.get(response_id)
        if stored is None:
            raise SimError(
                404, f"Response with id '{response_id[:200]}' not found.", "invalid_request_error"
            )
        return stored

    async def retrieve(self, request: Request) -> Response:
        try:
            stored = self._find(request)
        except SimError as err:
            return self.render.error(err)
        if request.query_params.get("stream") == "true":
            after = int(request.query_params.get("starting_after") or -1)
            self.sim.inflight += 1
            rec = self.sim.record(request, None)
            return self.render.stream(self._stream(stored.final, rec, after=after), {})
        return _json_response(stored.view(self.clock()))

    async def delete(self, request: Request) -> Response:
        try:
            stored = self._find(request)
        except SimError as err:
            return self.render.error(err)
        response_id = stored.final["id"]
        del self.stored[response_id]
        return _json_response({"id": response_id, "object": "response", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        try:
            stored = self._find(request)
            if not stored.final.get("background"):
                raise shapes.bad("Only responses created with background=true can be cancelled.")
        except SimError as err:
            return self.render.error(err)
        if self.clock() < stored.ready_at:
            stored.cancelled = True
        return _json_response(stored.view(self.clock()))

    async def input_items(self, request: Request) -> Response:
        try:
            stored = self._find(request)
            limit = int(request.query_params.get("limit") or 20)
        except (SimError, ValueError) as err:
            return self.render.error(err if isinstance(err, SimError) else shapes.bad("bad limit"))
        items = list(stored.items)
        if request.query_params.get("order", "desc") == "desc":
            items.reverse()
        after = request.query_params.get("after")
        if after:
            ids = [i.get("id") for i in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[: max(1, min(100, limit))]
        return _json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > len(page),
            }
        )

    async def input_tokens(self, request: Request) -> Response:
        try:
            self.sim.authorize(request, False)
            body = _json(await request.body())
            if not isinstance(body, dict):
                raise shapes.bad("We could not parse the JSON body of your request.")
            context, _ = self._context(body)
            count = shapes.prompt_tokens([*context, *shapes.input_items(body)], body)
        except SimError as err:
            return self.render.error(err)
        return _json_response({"object": "response.input_tokens", "input_tokens": count})


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _json_response(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def _with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item if "id" in item else {"id": shapes.new_id("msg"), **item} for item in items]


def _warm_up(plan: shapes.Plan, stored: Stored) -> None:
    """`generate: false` (Codex's first frame on a socket): the response is empty."""
    output = plan.response["output"]
    if output:
        stored.context = stored.context[: -len(output)]
    plan.response["output"] = []
    plan.response["usage"] = {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
