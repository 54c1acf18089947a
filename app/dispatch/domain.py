"""One Scale-up domain at run time: its upstream client, dispatcher and health.

Health has three inputs: the background probe (`healthy`: True/False, None before the
first answer or with probes disabled), the circuit breaker (opened by live traffic),
and discovered models. `available()` is what routing and `/health/ready` use.

Two states are shown but leave a domain available: `throttled` (its upstream said
429 and its pacer is cooling down: requests queue, they are not refused) and
`quota_exhausted` (the upstream account's balance is empty: each request still makes
its one attempt, so the first answer after a top-up clears it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property

from app.dispatch.dispatcher import Dispatcher
from app.kinds import DomainState
from app.log import redacted_url
from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed
from app.upstream.breaker import Breaker, BreakerState
from app.upstream.budget import RetryBudget
from app.upstream.cause import Failure, address
from app.upstream.client import UpstreamClient
from app.upstream.probe import ProbeResult

_EWMA = 0.2
log = logging.getLogger("tokengate.domain")


@dataclass
class Domain:
    spec: DomainSpec
    client: UpstreamClient
    dispatcher: Dispatcher
    breaker: Breaker
    budget: RetryBudget
    healthy: bool | None = None
    discovered: frozenset[str] | None = None
    latency: float = 0.05
    last_probe: ProbeResult | None = None
    upstream_models: frozenset[str] = field(default_factory=frozenset)
    quota_exhausted: bool = False
    last_failure: Failure | None = None  # the latest cause, kept after a recovery (with age)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def where(self) -> str:
        """The upstream's host:port (a URL's credentials are never shown)."""
        return address(self.spec.api_base)

    @property
    def weight(self) -> float:
        return self.spec.weight

    @property
    def load(self) -> int:
        """Requests in flight or queued here."""
        return self.dispatcher.inflight + len(self.dispatcher.queue)

    @property
    def saturated(self) -> bool:
        """Requests are waiting in its queue (affinity then spills past it)."""
        return len(self.dispatcher.queue) > 0

    def models(self) -> frozenset[str] | None:
        return self.spec.models if self.spec.models is not None else self.discovered

    def serves(self, model: str) -> bool:
        models = self.models()
        return models is None or model in models

    def speaks(self, anthropic: bool) -> bool:
        return self.spec.api_style.speaks(anthropic)

    def available(self) -> bool:
        return self.healthy is not False and not self.breaker.is_open

    def expected_wait(self) -> float:
        outstanding = self.dispatcher.inflight + len(self.dispatcher.queue)
        cooling = self.dispatcher.pacer.cooling()
        return cooling + (outstanding + 1) * self.latency / self.spec.weight

    def note_quota(self, exhausted: bool) -> None:
        """The upstream's answer about its account balance (logged when it changes)."""
        if exhausted == self.quota_exhausted:
            return
        self.quota_exhausted = exhausted
        if exhausted:
            log.error(
                "domain %s: the upstream answered insufficient_quota (account balance "
                "exhausted); requests get 429 insufficient_quota until it is topped up",
                self.name,
            )
        else:
            log.warning("domain %s: the upstream serves again (balance restored)", self.name)

    def record_probe(self, result: ProbeResult) -> None:
        """Apply a health probe's answer; a model list it brought replaces the discovered one."""
        self.healthy, self.last_probe = result.ok, result
        if result.failure is not None:
            self.last_failure = result.failure
        if result.models is not None:
            self.upstream_models = result.models
            self.discovered = result.models

    def note_failure(self, failed: AttemptFailed) -> None:
        """A live attempt's failure that says something of the upstream (on the failure
        path only: nothing is done for an answer)."""
        found = failed.failure(self.where)
        if found is not None:
            self.last_failure = found

    def why(self) -> str:
        """The cause of the latest failure, for a refusal's message ('' if none)."""
        if self.last_failure is None:
            return ""
        age = time.monotonic() - self.last_failure.at
        return f"{self.last_failure.summary}, {age:.0f} s ago"

    def observe_latency(self, seconds: float) -> None:
        self.latency += _EWMA * (seconds - self.latency)

    def state(self) -> DomainState:
        if self.breaker.is_open:
            return DomainState.CIRCUIT_OPEN
        if self.healthy is False:
            return DomainState.UNHEALTHY
        if self.quota_exhausted:
            return DomainState.QUOTA_EXHAUSTED
        if self.dispatcher.pacer.cooling() > 0:
            return DomainState.THROTTLED
        return DomainState.HEALTHY if self.healthy else DomainState.UNKNOWN

    def status(self) -> dict[str, object]:
        probe = self.last_probe
        models = self.models()
        return {
            "state": self.state(),
            "breaker": self.breaker.state if not self.breaker.is_open else BreakerState.OPEN,
            "api_base": redacted_url(self.spec.api_base),  # shown unauthenticated
            "models": sorted(models) if models is not None else None,
            "queue_depth": len(self.dispatcher.queue),
            "inflight": self.dispatcher.inflight,
            "max_inflight": self.dispatcher.max_inflight,
            "pace": self.dispatcher.pacer.snapshot(),
            "last_probe": None
            if probe is None
            else {
                "ok": probe.ok,
                "age_sec": round(time.monotonic() - probe.at, 1),
                "status": probe.status,
                "detail": probe.detail,
            },
            "last_failure": None if self.last_failure is None else self.last_failure.view(),
        }
