"""`POST /v1/messages/count_tokens`: Anthropic's token count, cheap and never charged.

    model (alias, default, key's allowed models)          400 / 403
      └► an available Anthropic-speaking domain serves it?
           yes: forward (one attempt, no queue, no slot)  ──► its answer
                 upstream 400/413/422 (the request itself) ──► relayed
                 anything else (404, 5xx, no connection)   ──► the estimate
           no, but some domain serves the model           ──► the estimate
           no domain serves it                            ──► 404 model_not_found

The estimate is the gateway's own (`app/limits/estimate.py`, the one admission uses),
said to be one in `x-tokengate-estimated: true`. Agents ask for counts in bursts (Claude
Code's `/context` sends 25 at once) to size their context, not to generate, so a count
takes no dispatch slot, no rate-limit reservation and no retry; it is still
authenticated, counted in `tokengate_requests_total` and access-logged by the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from app.dispatch.domain import Domain
from app.dispatch.routing import rank, serving
from app.errors import ModelNotFound
from app.pipeline.failure import client_error
from app.pipeline.plan import Planner
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import ClientRequest
from app.pipeline.trace import Attempt, Trace
from app.upstream.attempt import AttemptFailed, status_failure

ESTIMATE_HEADER = "x-tokengate-estimated"
_RELAYED = frozenset({400, 413, 422})  # the request itself is wrong: say so, do not guess


class TokenCount:
    def __init__(self, planner: Planner, clock: Callable[[], float] = time.perf_counter):
        self.planner = planner
        self.clock = clock

    async def count(self, call: ClientRequest, trace: Trace, *, cooperate: bool) -> JsonAnswer:
        _, target = self.planner.resolve(call)
        trace.model = target
        pinned = call.key.domain
        anthropic = rank(serving(self.planner.speaking[True], target, pinned))
        if anthropic:
            answer = await self._forward(call, trace, anthropic[0], target, cooperate)
            if answer is not None:
                return answer
        elif not serving(self.planner.domains, target, pinned):
            raise ModelNotFound(
                f"The model '{target}' does not exist or is not served; GET /v1/models lists "
                "the models this gateway serves.",
                param="model",
            )
        trace.estimated = True
        trace.prompt_tokens = call.prompt_tokens
        body = orjson.dumps({"input_tokens": call.prompt_tokens})
        return JsonAnswer(200, body, "application/json", {ESTIMATE_HEADER: "true"})

    async def _forward(
        self, call: ClientRequest, trace: Trace, domain: Domain, model: str, cooperate: bool
    ) -> JsonAnswer | None:
        """The domain's count, or None when the estimate must answer instead."""
        t0 = self.clock()
        trace.domain = domain.name
        outcome = "ok"
        try:
            resp = await domain.client.send(
                call.endpoint.path,
                call.body_for(model),
                stream=False,
                request_id=call.request_id,
                client_headers=call.client_headers,
            )
            data = await resp.read()
        except AttemptFailed as failure:
            outcome = failure.reason
            return None
        finally:
            ms = (self.clock() - t0) * 1000
            trace.upstream_ms += ms
            trace.attempts.append(Attempt(1, domain.name, model, outcome, ms))
        if resp.status in _RELAYED:
            ctype = resp.headers.get("content-type", "application/json")
            refused = status_failure(resp.status, data, ctype, resp.headers)
            raise client_error(refused, trace, cooperate=cooperate)
        counted = _input_tokens(data) if resp.status == 200 else None
        if counted is None:
            trace.attempts[-1].outcome = f"status_{resp.status}"
            trace.domain = None
            return None
        trace.prompt_tokens = counted
        headers = {"x-tokengate-domain": domain.name}
        return JsonAnswer(200, data, resp.headers.get("content-type", "application/json"), headers)


def _input_tokens(data: bytes) -> int | None:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    value = obj.get("input_tokens") if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
