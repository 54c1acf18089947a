"""What an admitted request holds for its key while it runs, beyond its token buckets:

- its output reservation (`rate_limit.reserve_output`): all of `max_tokens`, or an
  estimate from the key's recent answers for that model (`app/limits/output.py`), which
  every answered request teaches (`learn`);
- one of the key's `max_concurrent` slots (`app/limits/concurrency.py`): waited for in
  the key's line, released when the request ends, however it ends.
"""

from __future__ import annotations

from app.config.schema import Settings
from app.errors import ServiceUnavailable
from app.limits.admission import Admission
from app.limits.concurrency import ConcurrencyGate, Lease
from app.limits.limit_store import Spawn
from app.limits.output import OutputEstimator
from app.metrics import Metrics
from app.pipeline.request import EMBEDDINGS, ClientRequest
from app.pipeline.trace import Trace


class KeyHolds:
    def __init__(self, admission: Admission, metrics: Metrics, spawn: Spawn) -> None:
        self.admission = admission
        self.metrics = metrics
        self.outputs = OutputEstimator()
        self.gate = ConcurrencyGate(admission.store.key_slots(), spawn)

    def configure(self, settings: Settings, default_model: str | None) -> None:
        limits = settings.rate_limit
        self.default_max_tokens = limits.default_max_tokens
        self.reserve_output = limits.reserve_output
        self.outputs.percentile = limits.output_percentile
        self.max_wait = settings.token_scheduler.max_queue_wait_ms / 1000
        self.default_model = default_model or "-"

    def _model(self, call: ClientRequest) -> str:
        return call.model or self.default_model

    def reservation(self, call: ClientRequest) -> int:
        """Tokens reserved at admission: the prompt estimate and the output allowance."""
        mode = call.key.reserve_output or self.reserve_output
        if mode == "max_tokens" or call.endpoint is EMBEDDINGS:
            return call.cost(self.default_max_tokens)
        output = self.outputs.reserve(
            call.key.alias, self._model(call), call.max_tokens, self.default_max_tokens
        )
        return call.prompt_tokens + output * call.choices

    def learn(self, call: ClientRequest, trace: Trace, status: int) -> None:
        """An answered request's size, per choice, for the key's next reservations."""
        answered = status == 200 and trace.prompt_tokens and not trace.estimated
        if answered and call.endpoint is not EMBEDDINGS:
            per_choice = -(-trace.completion_tokens // max(1, call.choices))
            self.outputs.observe(call.key.alias, self._model(call), per_choice)

    def capped(self, call: ClientRequest) -> bool:
        """The key has a `max_concurrent` (live or configured): `slot` is to be awaited.
        Most keys have none, and then no coroutine is made for it."""
        return self.gate.cap(call.key.alias, call.key.max_concurrent) is not None

    async def slot(self, call: ClientRequest, trace: Trace) -> Lease | None:
        """One of the key's `max_concurrent` slots, waiting in its line if need be."""
        alias = call.key.alias
        cap = self.gate.cap(alias, call.key.max_concurrent)
        if cap is None:
            return None
        if not self.gate.slots.shared:  # each of N workers holds 1/N (as for limits)
            cap = max(1, cap // self.admission.divisor)
        try:
            lease, waited = await self.gate.acquire(alias, cap, self.max_wait)
        except ServiceUnavailable:
            self.metrics.record_key_wait(alias, "timeout")
            raise
        if waited:
            trace.queue_ms += waited * 1000
            self.metrics.record_key_wait(alias, "granted")
        return lease
