"""Accounting: everything after admission ends here exactly once, whatever happens
(an answer, an error, a client disconnect, a stream drop).

    Accounting.finish(call, trace, ticket, status)   release the key's concurrency lease,
        learn the estimate, price what was consumed (pricing.py), add it to the agent
        session's spend, settle the reservation to it, count it, write the access line
    Accounting.json_answer(...)   a JSON answer's usage into the trace, then `finish`
    Accounting.log(trace, status, exc, entry)   the metrics, the status page's recent
        errors and the access line (also for a request refused before admission)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.billing.ledger import UsageEntry
from app.billing.prices import render
from app.billing.timetable import NO_WINDOW
from app.dispatch.domain import Domain
from app.errors import GatewayError
from app.limits.admission import Admission, Ticket
from app.limits.concurrency import Lease
from app.limits.sessions import SessionBook
from app.log import log_fields
from app.metrics import Metrics
from app.pipeline.holds import KeyHolds
from app.pipeline.pricing import Pricing
from app.pipeline.replies import JsonAnswer, Reply
from app.pipeline.request import ClientRequest
from app.pipeline.trace import Trace
from app.status.recent import RecentFailure
from app.upstream.answer_usage import Usage
from app.upstream.delivered import delivered_tokens

access_log = logging.getLogger("tokengate.access")
NO_DOMAIN = "none"  # the `domain` of a request refused before any domain was chosen


class Accounting:
    def __init__(
        self,
        admission: Admission,
        metrics: Metrics,
        holds: KeyHolds,
        pricing: Pricing,
        session_spend: SessionBook,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.admission = admission
        self.metrics = metrics
        self.holds = holds
        self.pricing = pricing
        self.session_spend = session_spend
        self.clock = clock
        self.default_max_tokens = 0
        self.unpriced_seen: set[str] = set()  # spend alerts' `unpriced_model`

    @staticmethod
    def abandoned(call: ClientRequest, trace: Trace, status: int) -> tuple[int, int]:
        """The client left while the upstream had its (non-streamed) request: the upstream
        read the prompt and charges for it, and nothing of the answer was delivered, so
        the prompt estimate is what was consumed (flagged estimated)."""
        if status == 499 and trace.attempts and trace.attempts[-1].outcome == "cancelled":
            trace.estimated = True
            return call.prompt_tokens, 0
        return 0, 0

    def json_answer(
        self,
        call: ClientRequest,
        trace: Trace,
        ticket: Ticket,
        reply: Reply,
        domain: Domain,
        lease: Lease | None = None,
    ) -> JsonAnswer:
        usage = reply.usage
        assert usage is not None
        trace.model = usage.model or trace.attempts[-1].model
        trace.prompt_tokens, trace.completion_tokens = usage.prompt, usage.completion
        trace.cached_tokens, trace.cache_write_tokens = usage.cached, usage.cache_write
        trace.service_tier = usage.tier
        if call.endpoint.responses:
            self._responses_answer(call, trace, usage)
        elif not usage.reported:  # a 200 without usage: count what it delivered
            trace.prompt_tokens, trace.estimated = call.prompt_tokens, True
            trace.completion_tokens = delivered_tokens(reply.first)
        entry = self.finish(call, trace, ticket, 200, lease=lease)
        headers = {
            **ticket.headers(),
            "x-tokengate-domain": domain.name,
            "x-tokengate-cost": self.pricing.spend_text(entry.cost_nanos),
        }
        ctype = reply.response.headers.get("content-type", "application/json")
        return JsonAnswer(200, reply.first, ctype, headers)

    def _responses_answer(self, call: ClientRequest, trace: Trace, usage: Usage) -> None:
        """A background response answers `queued`, without usage: it is charged what
        was reserved, as its usage is only known once it is done. (The id it names is
        recorded by `handle`, once the answer is settled.)"""
        if not usage.reported:
            trace.prompt_tokens = call.prompt_tokens
            trace.completion_tokens = call.cost(self.default_max_tokens) - call.prompt_tokens
            trace.estimated = True

    def finish(
        self,
        call: ClientRequest,
        trace: Trace,
        ticket: Ticket,
        status: int,
        *,
        exc: BaseException | None = None,
        failed: tuple[int, int] = (0, 0),
        lease: Lease | None = None,
    ) -> UsageEntry:
        """Settle, count and log; exactly once per admitted request."""
        if lease is not None:
            lease.release()
        if trace.unanswered:  # each may have been billed its prompt (see `Trace.unanswered`)
            failed = (failed[0] + trace.unanswered * call.prompt_tokens, failed[1])
            trace.estimated = True
        self.holds.learn(call, trace, status)
        if trace.cached_tokens or trace.cache_write_tokens:
            self.metrics.record_prompt_cache(
                trace.domain or "-", trace.cached_tokens, trace.cache_write_tokens
            )
        model = trace.model or (trace.attempts[-1].model if trace.attempts else call.model) or "-"
        window = self.pricing.window()
        entry = UsageEntry(
            key=call.key.alias,
            model=model,
            prompt_tokens=trace.prompt_tokens,
            completion_tokens=trace.completion_tokens,
            error=status != 200,
            failed_prompt_tokens=failed[0],
            failed_completion_tokens=failed[1],
            domain=trace.domain or "-",
            cached_tokens=trace.cached_tokens,
            status=status,
            team=call.key.team or "-",
            cache_write_tokens=trace.cache_write_tokens,
            estimated=trace.estimated,
            cost_nanos=self.pricing.cost(trace, failed, window),
            session=call.session_label,
            window=window,
        )
        if entry.session != "-":
            periods = self.session_spend.periods_now(call.key.session_budgets)
            self.session_spend.add(
                entry.key, entry.session, entry.tokens, entry.cost_nanos, periods
            )
        self.admission.settle(ticket, entry, dispatched=trace.dispatched)
        self.metrics.record_spend(entry.key, entry.model, entry.cost_nanos)
        if entry.cost_nanos is None:
            self.unpriced_seen.add(entry.model)
        self.log(trace, status, exc, entry)
        return entry

    def log(
        self,
        trace: Trace,
        status: int,
        exc: BaseException | None,
        usage: UsageEntry | None = None,
    ) -> None:
        trace.status = status
        if isinstance(exc, GatewayError):
            trace.error = exc.code or exc.type
        elif exc is not None:
            trace.error = type(exc).__name__
        seconds = self.clock() - trace.started
        domain, model = trace.domain or NO_DOMAIN, trace.model or trace.requested_model
        if usage is None:  # refused before admission: no tokens, no ledger entry
            self.metrics.record_request(domain, model, status, seconds)
        else:
            self.metrics.record_answer(domain, model, usage, status, seconds)
        if status >= 400:
            self.metrics.record_error(
                RecentFailure(
                    trace.request_id,
                    trace.key,
                    model,
                    trace.domain,
                    status,
                    trace.error,
                    _error_message(status, exc),
                )
            )
        if access_log.isEnabledFor(logging.INFO):
            fields = trace.fields(seconds * 1000)
            # cost: a decimal string in `currency`, null when the model has no price; a
            # request refused before admission consumed nothing
            cost = 0 if usage is None else usage.cost_nanos
            fields["cost"] = None if cost is None else render(cost)
            fields["currency"] = self.pricing.currency
            fields["team"] = call_team(usage)
            fields["window"] = None if usage is None or usage.window == NO_WINDOW else usage.window
            log_fields(access_log, "request", fields)
        if trace.span is not None:
            trace.span.end(trace, status)


def call_team(usage: UsageEntry | None) -> str | None:
    return None if usage is None or usage.team == "-" else usage.team


def _error_message(status: int, exc: BaseException | None) -> str:
    """What the status page says of an error answer: the client's own message for a
    `GatewayError` (written to be shown), a fixed sentence otherwise (never an
    exception's text, which could carry anything)."""
    if isinstance(exc, GatewayError):
        return exc.message
    if status == 499:
        return "the client closed the connection before the answer ended"
    if exc is None:
        return "the upstream stream broke off after it started"
    return "internal error; see the gateway log"


def status_of(exc: BaseException) -> int:
    if isinstance(exc, GatewayError):
        return exc.status
    return 499 if isinstance(exc, BaseException) and not isinstance(exc, Exception) else 500
