"""The Responses API's stateful side: where each response lives, and the calls that
follow one.

    POST /v1/responses (HTTP, or one WebSocket `response.create`)
      previous_response_id? ── homes.where(id), owned by this key? ──► call.home: only
      │                        that domain serves it; else 400 previous_response_not_found
      └► Pipeline.handle: limits, queue, retries, fallback, metrics, ledger
           └► the answer names its id (JSON `id`, stream `response.created`)
                └► homes.remember(id, Home(domain, key)): the owner is in the database
                   before the client sees the id                 unless `store: false`

    GET / DELETE /v1/responses/{id}, POST …/cancel, GET …/input_items
      └► owned by this key (the database says so)? the home domain, relayed as it
         answered; else 404 not_found, the same for an id nobody created, and no
         upstream is asked.

    POST /v1/responses/input_tokens
      └► a domain serving the model; if none speaks that route, the gateway's own
         estimate, marked `x-tokengate-estimated: true`.

Following a stored response and counting input tokens go through the key's admission
first (`Toll`): a key refused on chat is refused here too, before any upstream is asked;
each is charged a request and no tokens.

A response belongs to the key that created it: another key asking for it (or chaining
from it) gets the answer for an unknown id.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol
from urllib.parse import parse_qs

import orjson

from app.dispatch.domain import Domain
from app.dispatch.homes import Home, ResponseHomes
from app.errors import GatewayError, InvalidRequest, NotFound, UpstreamFailed
from app.limits import estimate
from app.limits.admission import Ticket
from app.log import log_fields
from app.metrics import Metrics
from app.pipeline.answer import Answer
from app.pipeline.core import Pipeline
from app.pipeline.request import RESPONSES_COMPACT, ClientRequest
from app.pipeline.wire import parse_json
from app.runtime import KeySpec
from app.upstream.attempt import AttemptFailed
from app.upstream.transport import UpstreamResponse

access_log = logging.getLogger("tokengate.access")
# What an id may look like before it is put in an upstream path (no `/`, `?`, `..`).
_ID = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_NOT_SERVED = (404, 405, 501)  # an upstream without the input_tokens route


@dataclass
class Relayed:
    """An upstream answer passed to the client as it came: a body, or SSE chunks (a
    background response replayed with `?stream=true`) with the close that ends them."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    chunks: AsyncIterator[bytes] | None = None
    close: Callable[[], Awaitable[None]] | None = None


def previous_not_found(response_id: str) -> InvalidRequest:
    return InvalidRequest(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


class Deferrer(Protocol):
    """Holds deferred background responses (`app.batch.held`, set by the gateway)."""

    def wants(self, call: ClientRequest) -> bool: ...

    async def hold(self, call: ClientRequest) -> Answer: ...

    async def follow(
        self, key: KeySpec, method: str, response_id: str, suffix: str, query: str
    ) -> tuple[int, bytes]: ...

    async def continued(self, key: KeySpec, response_id: str) -> tuple[str, str] | None: ...


class ResponsesService:
    deferrer: Deferrer | None = None
    held_prefix = "resp_tgd"  # the ids the deferrer mints (app.batch.held.PREFIX)

    def __init__(
        self,
        pipeline: Pipeline,
        homes: ResponseHomes,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pipeline = pipeline
        self.homes = homes
        self.metrics = metrics
        self.clock = clock
        self.toll = pipeline.toll

    # -- creating ----------------------------------------------------------------------
    async def create(self, call: ClientRequest) -> Answer:
        if self.deferrer is not None and call.background and self.deferrer.wants(call):
            return await self.deferrer.hold(call)
        previous = call.body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            if self.deferrer is not None and previous.startswith(self.held_prefix):
                await self._continue_held(call, previous)
            else:
                call.home = (await self._owned(call.key, previous, previous_not_found)).domain
        stored = call.body.get("store") is not False  # OpenAI: else kept nowhere
        if stored and call.endpoint is not RESPONSES_COMPACT:  # a compaction is no response
            call.on_response = partial(self._created, call.key.alias)
        return await self.pipeline.handle(call)

    async def _continue_held(self, call: ClientRequest, previous: str) -> None:
        """Continue a completed held response (`app.batch.held`): the upstream knows it by
        its own id, on the domain that served it."""
        assert self.deferrer is not None
        found = await self.deferrer.continued(call.key, previous)
        if found is None:
            raise previous_not_found(previous)
        upstream_id, call.home = found
        call.body["previous_response_id"] = upstream_id
        call.raw = orjson.dumps(call.body)

    async def _created(self, owner: str, response_id: str, domain: str) -> None:
        await self.homes.remember(response_id, Home(domain, owner))

    async def _owned(
        self, key: KeySpec, response_id: str, unknown: Callable[[str], GatewayError]
    ) -> Home:
        """The home of a response `key` created; anything else (an id no key created,
        another key's, a malformed one) is the same `unknown(id)`, decided without asking
        any upstream."""
        home = await self.homes.where(response_id) if _ID.match(response_id) else None
        if home is None or home.owner != key.alias:
            raise unknown(response_id)
        return home

    async def warm_up(self, key: KeySpec, model: object, request_id: str) -> None:
        """A WebSocket `generate: false`: nothing goes upstream, but it is a request of the
        key's all the same (admitted, charged one request and no tokens, logged)."""
        started = self.clock()
        ticket = await self._admit(key, 0, request_id, "responses_ws.warmup", started)
        name = model if isinstance(model, str) else None
        self.toll.settle(ticket, key, name, "-", 200)
        self._log(request_id, key, "responses_ws.warmup", "-", 200, started)

    # -- following a stored response ------------------------------------------------------
    async def follow(
        self,
        key: KeySpec,
        request_id: str,
        method: str,
        response_id: str,
        suffix: str = "",
        query: str = "",
    ) -> Relayed:
        """Relay `method /v1/responses/{id}{suffix}?{query}` to the domain holding `id`."""
        started = self.clock()
        endpoint = f"responses{suffix.replace('/', '.')}.{method.lower()}"
        ticket = await self._admit(key, 0, request_id, endpoint, started)  # an unknown id too
        status, domain_name = 404, "-"
        try:
            if self.deferrer is not None and response_id.startswith(self.held_prefix):
                status, body = await self.deferrer.follow(key, method, response_id, suffix, query)
                return Relayed(status, body)
            home = await self._owned(key, response_id, _unknown)
            domain = self._home_domain(key, home)
            path = f"/v1/responses/{response_id}{suffix}" + (f"?{query}" if query else "")
            stream = parse_qs(query).get("stream", [""])[-1].lower() == "true"
            relayed = await self._relay_to(domain, path, method, stream, request_id)
            status, domain_name = relayed.status, domain.name
            relayed.headers.update(ticket.headers())
            if method == "DELETE" and status == 200:
                await self.homes.forget(response_id)
            return relayed
        except BaseException as exc:
            status = _status_of(exc)
            raise
        finally:
            self.toll.settle(ticket, key, None, domain_name, status)
            self._log(request_id, key, endpoint, domain_name, status, started)

    def _home_domain(self, key: KeySpec, home: Home) -> Domain:
        for d in self.pipeline.planner.responders:
            if d.name == home.domain and key.domain in (None, d.name):
                return d
        raise NotFound("no domain serves the Responses API for this key")

    @staticmethod
    async def _relay_to(
        domain: Domain, path: str, method: str, stream: bool, request_id: str
    ) -> Relayed:
        body = b"" if method == "POST" else None
        try:
            resp = await domain.client.send(
                path, body, stream=stream, request_id=request_id, method=method
            )
        except AttemptFailed as failed:
            raise UpstreamFailed(f"domain {domain.name} did not answer ({failed.reason})") from None
        return await _relay(resp, stream, domain.name)

    # -- counting input tokens -------------------------------------------------------------
    async def input_tokens(self, key: KeySpec, raw: bytes, request_id: str) -> Relayed:
        """Admitted like a request with its input (`Toll`), charged a request and no
        tokens; counted upstream, or by the gateway's estimate."""
        started, endpoint = self.clock(), "responses.input_tokens"
        try:
            body = parse_json(raw)
        except GatewayError as exc:
            self._log(request_id, key, endpoint, "-", exc.status, started)
            raise
        ticket = await self._admit(key, _estimate(body), request_id, endpoint, started)
        status, domain_name = 200, "-"
        try:
            relayed, domain_name = await self._count(key, body, request_id)
            relayed.headers.update(ticket.headers())
            return relayed
        except BaseException as exc:
            status = _status_of(exc)
            raise
        finally:
            asked = body.get("model")  # a client's JSON: anything, and settle takes a name
            model = asked if isinstance(asked, str) else None
            self.toll.settle(ticket, key, model, domain_name, status)
            self._log(request_id, key, endpoint, domain_name, status, started)

    async def _admit(
        self, key: KeySpec, tokens: int, request_id: str, endpoint: str, started: float
    ) -> Ticket:
        """The key's toll for a request of these routes; a refusal is logged here, since
        nothing was admitted to settle. (Not a `ticket = None` set in a `try` and read in
        its `finally`: compiled, that read fails when the `try` raised first.)"""
        try:
            return await self.toll.admit(key, tokens)
        except BaseException as exc:
            self._log(request_id, key, endpoint, "-", _status_of(exc), started)
            raise

    async def _count(
        self, key: KeySpec, body: dict[str, Any], request_id: str
    ) -> tuple[Relayed, str]:
        asked = body.get("model") or self.pipeline.runtime.default_model
        target = self.pipeline.planner.target(key, asked) if isinstance(asked, str) else None
        previous = body.get("previous_response_id")
        candidates = [d for d in self.pipeline.planner.responders if key.domain in (None, d.name)]
        if isinstance(previous, str) and previous:
            home = await self._owned(key, previous, previous_not_found)
            candidates = [d for d in candidates if d.name == home.domain]
        if target is not None:
            candidates = [d for d in candidates if d.serves(target)]
            body["model"] = target
        data = orjson.dumps(body)
        for domain in candidates:
            try:
                resp = await domain.client.send(
                    "/v1/responses/input_tokens", data, stream=False, request_id=request_id
                )
            except AttemptFailed:
                continue
            relayed = await _relay(resp, False, domain.name)
            if relayed.status in _NOT_SERVED and b"previous_response_not_found" not in relayed.body:
                continue
            return relayed, domain.name
        return Relayed(
            200,
            orjson.dumps({"object": "response.input_tokens", "input_tokens": _estimate(body)}),
            headers={"x-tokengate-estimated": "true"},
        ), "-"

    def _log(
        self, request_id: str, key: KeySpec, endpoint: str, domain: str, status: int, t0: float
    ) -> None:
        seconds = self.clock() - t0
        self.metrics.record_request(domain, None, status, seconds)
        if access_log.isEnabledFor(logging.INFO):
            fields = {
                "request_id": request_id,
                "key": key.alias,
                "endpoint": endpoint,
                "domain": domain,
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
            }
            log_fields(access_log, "request", fields)


def _estimate(body: dict[str, Any]) -> int:
    return estimate.responses_prompt_tokens(
        body.get("input"), body.get("instructions"), body.get("tools")
    )


def _unknown(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id[:200]}' not found.")


async def _relay(resp: UpstreamResponse, stream: bool, domain: str) -> Relayed:
    ctype = resp.headers.get("content-type", "application/json")
    headers = {"x-tokengate-domain": domain}
    if stream and resp.status == 200 and ctype.startswith("text/event-stream"):
        return Relayed(200, b"", ctype, headers, resp.chunks(), resp.close)
    try:
        data = await resp.read()
    finally:
        await resp.close()
    return Relayed(resp.status, data, ctype, headers)


def _status_of(exc: BaseException) -> int:
    return exc.status if isinstance(exc, GatewayError) else 499
