"""Which domain serves a request: the model, then its fallbacks, on the domains serving
each, best first.

    [requested model, *fallbacks] x domains serving each (plan.py)
      └► best first: the conversation's domain (affinity), else the least wait; at most
         MAX_DOMAINS_PER_MODEL of them; a domain whose queue was full or slow is not
         tried again for a fallback model (it would wait again)
          └► Attempts.on_domain: an answer, or a failure that moves on (a re-send, by
             the same rule as a retry) or ends the request with its client error
"""

from __future__ import annotations

from itertools import chain

from app.dispatch.affinity import SessionTable
from app.dispatch.dispatcher import Slot
from app.dispatch.domain import Domain
from app.dispatch.routing import rank
from app.errors import GatewayError, ServiceUnavailable
from app.metrics import Metrics
from app.pipeline.allowance import Allowance
from app.pipeline.attempts import Attempts
from app.pipeline.failure import client_error
from app.pipeline.plan import Planner
from app.pipeline.replies import Reply
from app.pipeline.request import ClientRequest
from app.pipeline.tiers import ServiceTiers
from app.pipeline.trace import Trace
from app.upstream.attempt import AttemptFailed

MAX_DOMAINS_PER_MODEL = 2


class Failover:
    def __init__(
        self,
        planner: Planner,
        allowance: Allowance,
        attempts: Attempts,
        tiers: ServiceTiers,
        metrics: Metrics,
    ) -> None:
        self.planner = planner
        self.allowance = allowance
        self.attempts = attempts
        self.tiers = tiers
        self.metrics = metrics
        self.sessions = SessionTable()
        self.affinity = False
        self.cooperate = False

    async def execute(
        self, call: ClientRequest, target: str, first: list[Domain], trace: Trace
    ) -> tuple[Reply, Domain, str, Slot]:
        last: BaseException | None = None
        congested: set[str] = set()  # full or slow queues: a fallback there would wait again
        plan = chain([(target, first)], self.planner.fallbacks(call, target))
        for i, (model, candidates) in enumerate(plan):
            if i:
                if not self.allowance.serves(call, model):
                    continue  # unpriced, and the key has a cost budget
                self.metrics.record_fallback(target, model)
            ranked = self._order(call, candidates)
            if congested:
                ranked = [d for d in ranked if d.name not in congested]
            if not ranked and last is None:
                last = self._no_domain(model, candidates)
            for domain in ranked[:MAX_DOMAINS_PER_MODEL]:
                try:
                    reply, slot = await self.attempts.on_domain(call, model, domain, trace)
                    return reply, domain, model, slot
                except AttemptFailed as failure:
                    last = failure
                    # Another domain or model is a re-send too: the same rule as a retry.
                    if not failure.moves_on or not self.attempts.retry.may_resend(failure):
                        raise self.final_error(failure, trace) from None
                except ServiceUnavailable as exc:
                    last = exc
                    congested.add(domain.name)
        raise self.tiers.refusal(call, self.final_error(last, trace))

    def _order(self, call: ClientRequest, candidates: list[Domain]) -> list[Domain]:
        """Best first: the conversation's domain (affinity), else the least wait."""
        if len(candidates) < 2 or not self.affinity:
            return rank(candidates)
        ranked, placed = self.sessions.order(candidates, call.session)
        if placed is not None:
            self.metrics.record_affinity(ranked[0].name, placed)
        return ranked

    def _no_domain(self, model: str, candidates: list[Domain]) -> ServiceUnavailable:
        states = ", ".join(
            f"{d.name}: {d.state()}" + (f" after {d.why()}" if d.why() else "") for d in candidates
        )
        wait = min((d.breaker.cfg.open_sec for d in candidates if d.breaker.is_open), default=5.0)
        return ServiceUnavailable(
            f"no healthy domain serves model '{model}' ({states})",
            code="no_healthy_domain",
            retry_after=wait,
            should_retry=False if self.cooperate else None,
        )

    def final_error(self, last: BaseException | None, trace: Trace) -> GatewayError:
        if last is None or isinstance(last, GatewayError):
            return last or ServiceUnavailable("no domain available", code="no_healthy_domain")
        assert isinstance(last, AttemptFailed)
        resent = self.attempts.retry.may_resend(last)
        return client_error(last, trace, cooperate=self.cooperate, resent=resent)
