"""Deferred background responses: held in the database, released like a batch.

A background Responses request (`background: true`, not streamed, stored) is deferred when
its key says so (`keys[].defer_requests`: `background` or `all`) or it asks
(`metadata.tokengate_defer = "true"`). Instead of going upstream it is answered at once
with what OpenAI answers a background request, a Response in status `queued`, under an id
the gateway mints (`resp_tgd…`, never hex, so it can not meet an upstream's id). It is
stored as a one-item batch (kind `response`: `store.py`), so it is as durable as a batch:
it survives a restart, and another replica takes it over once the lease of a dead one
lapses; the batch runner holds it for its window (`deferral.py`: the key's, its domain's,
else `batch.defer_window`; none: idle quota at once), then sends it in the `batch` class
(spare capacity only, behind interactive traffic, paced to the domain's quota) as an
ordinary request, and stores the answer under the gateway's id:

    queued ──(window / idle quota)──► in_progress ──► completed | failed | incomplete
       └──── POST …/cancel ─────────────────────────► cancelled

`GET /v1/responses/{id}`, `…/cancel`, `…/input_items` and `DELETE` answer from the
database, for the key that created it only: any other key gets the 404 of an unknown id.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from app.batch.service import WINDOW_SEC
from app.batch.store import BatchStore
from app.errors import InvalidRequest, NotFound, RateLimited
from app.kinds import BatchStatus, ItemState
from app.pipeline.core import Pipeline
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import RESPONSES, ClientRequest
from app.runtime import KeySpec

PREFIX = "resp_tgd"  # 'g' is not hex: no upstream's `resp_<hex>` id starts so
KIND = "response"
OPT_IN = "tokengate_defer"  # metadata key a client sets to "true" to ask for deferral
_TERMINAL = ("completed", "failed", "incomplete", "cancelled")


def owns(response_id: str) -> bool:
    """An id of a held response (the gateway's own), not an upstream's."""
    return response_id.startswith(PREFIX)


class HeldResponses:
    def __init__(self, store: BatchStore, pipeline: Pipeline, wake: Any) -> None:
        self.store = store
        self.pipeline = pipeline
        self.wake = wake  # the batch runner's: a new held response is looked at at once

    # -- creating ------------------------------------------------------------------------
    def wants(self, call: ClientRequest) -> bool:
        """Is this Responses request to be held? Background, not streamed, stored, and its
        key defers background work or it asks (`metadata.tokengate_defer`)."""
        body = call.body
        if call.endpoint is not RESPONSES or not call.background or call.stream:
            return False  # (a compaction is no response to keep)
        if body.get("store") is False:
            return False
        if call.key.defer_requests in ("background", "all"):
            return True
        meta = body.get("metadata")
        return isinstance(meta, dict) and str(meta.get(OPT_IN, "")).lower() == "true"

    async def hold(self, call: ClientRequest) -> JsonAnswer:
        """Store the request and answer `queued` (the model is checked first: a request
        no domain can serve is refused now, not hours later)."""
        if call.body.get("previous_response_id"):
            raise InvalidRequest(
                "a deferred background response can not continue another response "
                "(previous_response_id): send it without deferral",
                param="previous_response_id",
            )
        target, domains = self.pipeline.planner.plan(call)
        cap = self.pipeline.runtime.settings.batch.max_items
        if await self.store.held_count(call.key.alias, PREFIX) >= cap:
            raise RateLimited(
                f"this key already holds {cap} deferred responses (batch.max_items): wait "
                "for some to run, or cancel some",
                retry_after=60.0,
            )
        now = int(time.time())
        rid = f"{PREFIX}{os.urandom(12).hex()}"
        request = {k: v for k, v in call.body.items() if k not in ("background", "stream")}
        meta = request.get("metadata")
        if isinstance(meta, dict) and OPT_IN in meta:  # the gateway's word, not the model's
            request["metadata"] = {k: v for k, v in meta.items() if k != OPT_IN} or None
        response = queued(rid, now, call.body, target)
        row: dict[str, Any] = {
            "id": rid,
            "object": KIND,
            "kind": KIND,
            "endpoint": "/v1/responses",
            "status": BatchStatus.IN_PROGRESS,
            "created_at": now,
            "expires_at": now + WINDOW_SEC,
            "domain": domains[0].name,
            "response": response,
        }
        await self.store.add_batch(row, call.key.alias, [(rid, request, ItemState.PENDING, None)])
        self.wake()
        return JsonAnswer(
            200,
            orjson.dumps(response),
            "application/json",
            {"x-tokengate-deferred": "true"},
        )

    async def continued(self, key: KeySpec, response_id: str) -> tuple[str, str] | None:
        """(the upstream's id, its domain) of a completed held response of `key`, for a
        request continuing it (`previous_response_id`); None: not `key`'s, or not done."""
        found = await self.store.get_batch(response_id)
        if found is None or found[0] != key.alias or found[1].get("kind") != KIND:
            return None
        row = found[1]
        upstream, domain = row.get("upstream_id"), row.get("domain")
        if row["response"].get("status") != "completed" or not upstream or not domain:
            return None
        return str(upstream), str(domain)

    # -- following -----------------------------------------------------------------------
    async def follow(
        self, key: KeySpec, method: str, response_id: str, suffix: str, query: str
    ) -> tuple[int, bytes]:
        """GET / DELETE / POST cancel / GET input_items of a held response of `key`."""
        found = await self.store.get_batch(response_id)
        if found is None or found[0] != key.alias or found[1].get("kind") != KIND:
            raise NotFound(f"Response with id '{response_id[:200]}' not found.")
        row = found[1]
        response: dict[str, Any] = row["response"]
        if method == "DELETE" and not suffix:
            await self.store.delete_batch(response_id)
            return 200, orjson.dumps({"id": response_id, "object": "response", "deleted": True})
        if method == "POST" and suffix == "/cancel":
            if response["status"] not in _TERMINAL:
                # terminal at once: no runner claims it again (one in flight finishes,
                # and its answer is dropped: `settled`)
                response["status"] = "cancelled"
                row["status"], row["cancelled_at"] = BatchStatus.CANCELLED, int(time.time())
                await self.store.save_batch(row)
            return 200, orjson.dumps(response)
        if method == "GET" and suffix == "/input_items":
            request = await self.store.first_request(response_id)
            return 200, orjson.dumps(_input_items(response_id, request or {}))
        if method == "GET" and not suffix:
            if "stream=true" in query.lower():
                raise InvalidRequest(
                    "a deferred response can not be streamed: GET it without stream=true",
                    param="stream",
                )
            return 200, orjson.dumps(response)
        raise NotFound(f"Response with id '{response_id[:200]}' not found.")


def queued(rid: str, now: int, body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Response OpenAI answers a background request with, in status `queued`."""
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": "queued",
        "background": True,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "service_tier": body.get("service_tier", "auto"),
        "store": True,
        "temperature": body.get("temperature"),
        "text": body.get("text"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "usage": None,
        "metadata": {k: v for k, v in (body.get("metadata") or {}).items() if k != OPT_IN},
    }


def settled(row: dict[str, Any], state: str | None, result: dict[str, Any] | None) -> None:
    """Write the outcome of a released response into its row (the runner, at the end):
    the upstream's Response under the gateway's id, or `failed` with the error."""
    response: dict[str, Any] = row["response"]
    if response["status"] == "cancelled" or row["status"] == BatchStatus.CANCELLED:
        response["status"] = "cancelled"
        return
    body = ((result or {}).get("response") or {}).get("body")
    if state == ItemState.DONE and isinstance(body, dict):
        row["upstream_id"] = body.get("id")
        row["domain"] = (result or {}).get("response", {}).get("domain") or row.get("domain")
        deferral = response.get("tokengate_deferral")
        response.clear()
        response.update(body)
        response["id"], response["background"] = row["id"], True
        response["status"] = body.get("status") or "completed"
        if deferral is not None:
            response["tokengate_deferral"] = deferral
        return
    response["status"] = "failed"
    error = (result or {}).get("error") or {"code": "expired", "message": "not run in 24 h"}
    response["error"] = {"code": error.get("code"), "message": error.get("message")}


def _input_items(rid: str, request: dict[str, Any]) -> dict[str, Any]:
    given = request.get("input")
    if isinstance(given, str):
        text = [{"type": "input_text", "text": given}]
        given = [{"type": "message", "role": "user", "content": text}]
    data = [
        {"id": f"msg_{rid[len(PREFIX) :]}_{i}", **item} if isinstance(item, dict) else item
        for i, item in enumerate(given or [])
    ]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data and isinstance(data[0], dict) else None,
        "last_id": data[-1].get("id") if data and isinstance(data[-1], dict) else None,
        "has_more": False,
    }
