"""Per-key admission: reserve at the door, settle when the answer ends.

A request reserves 1 request and `prompt estimate + output allowance` tokens (the
allowance: `max_tokens`, or an estimate from the key's recent answers, per
`rate_limit.reserve_output`; the pipeline computes it). Refused -> 429 at once,
nothing used.
When the answer ends (success, error or client disconnect) `settle` moves the token
reservation to what the upstream reported (or, for an interrupted stream, what was
streamed), and hands the entry to the usage ledger (in memory at once, durable within
`ledger.flush_interval_sec`).

Budgets (spend.py) are held the same way, after the rate limits: a request refused by a
budget gives its rate-limit reservation back, and one admitted holds the cost and tokens
of its prompt and whole output allowance (never the trainable estimate the rate limits
use) until `settle` replaces them with what it consumed.

Without Redis and with `--workers N`, each worker enforces 1/N of every limit, so
the total never silently becomes N times the configured one (logged at start).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from app.billing.budget_rules import ZERO, Amount, Ask
from app.billing.ledger import Ledger, UsageEntry
from app.billing.spend import Hold, SpendGate
from app.errors import GatewayError, RateLimited
from app.limits.bucket import Decision, Limits, Remaining
from app.limits.limit_store import LimitStore
from app.metrics import Metrics
from app.runtime import KeySpec


@dataclass(slots=True, init=False)
class Ticket:
    """(`__init__` written out: the compiled build runs it as C; see `ClientRequest`.)"""

    key: str
    limits: Limits
    reserved: int
    decision: Decision
    settled: bool
    hold: Hold | None  # the budgets' reservation

    def __init__(self, key: str, limits: Limits, reserved: int, decision: Decision) -> None:
        self.key = key
        self.limits = limits
        self.reserved = reserved
        self.decision = decision
        self.settled = False
        self.hold = None

    def headers(self) -> dict[str, str]:
        return ratelimit_headers(self.decision)


class KeyUse(NamedTuple):
    """What is left of a key's limits, as the status page shows it."""

    limits: Limits
    remaining: Remaining | None
    # "live": read now from this process's buckets; "last_request": what the shared
    # store said at the key's last admission here, refilled since (other replicas' use
    # since is not in it); "unknown": no request seen here, the buckets are shared.
    source: str
    age_sec: float | None = None  # how old a "last_request" figure is


@dataclass
class Admission:
    store: LimitStore
    metrics: Metrics
    ledger: Ledger
    divisor: int = 1
    overrides: dict[str, Limits] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    # The last decision per key alias and when it was made: what a shared store told
    # this process at the key's last admission (the status page's cheap view of Redis).
    seen: dict[str, tuple[Decision, float]] = field(default_factory=dict)
    spend: SpendGate | None = None  # budgets per key and team

    def limits_for(self, key: KeySpec) -> Limits:
        base = self.overrides.get(key.alias) or Limits(
            key.requests_per_minute, key.tokens_per_minute
        )
        if self.divisor == 1:
            return base
        return Limits(
            max(1, base.requests_per_minute // self.divisor),
            max(1, base.tokens_per_minute // self.divisor),
        )

    async def admit(
        self, key: KeySpec, cost: int, ask: Ask | None = None, *, priced: bool = True
    ) -> Ticket:
        """Reserve `cost` tokens against the rate limits, then `ask` (what the request
        may consume: its prompt and whole output allowance, in cost and tokens; default
        `cost` tokens) against the key's and its team's budgets (`priced`: False when
        the model has no price, which a cost budget refuses)."""
        limits = self.limits_for(key)
        decision = await self.store.reserve(key.alias, limits, cost)
        self.seen[key.alias] = (decision, self.clock())
        if decision.allowed:
            ticket = Ticket(key.alias, limits, cost, decision)
            if self.spend is not None:
                try:
                    need = Ask(Amount(0, cost)) if ask is None else ask
                    ticket.hold = await self.spend.reserve(key, need, priced=priced)
                except GatewayError:  # the rate limits' reservation goes back
                    self.store.settle(key.alias, limits, -cost, -1)
                    raise
            return ticket
        limit = decision.limit or "tokens"
        self.metrics.record_rate_limited(key.alias, limit)
        raise _refusal(decision, limit, cost, limits)

    def use(self, key: KeySpec) -> KeyUse:
        """Read live from a local store; from a shared one, the key's last admission on
        this process, refilled since at the limits' rates (other replicas' use since
        is not in it: the page says how old the figure is)."""
        limits = self.limits_for(key)
        live = self.store.peek(key.alias, limits)
        if live is not None:
            return KeyUse(limits, live, "live")
        seen = self.seen.get(key.alias)
        if seen is None:
            return KeyUse(limits, None, "unknown")
        decision, at = seen
        age = max(0.0, self.clock() - at)
        left = Remaining.projected(
            limits, decision.requests_remaining, decision.tokens_remaining, age
        )
        return KeyUse(limits, left, "last_request", round(age, 1))

    def settle(self, ticket: Ticket, entry: UsageEntry, *, dispatched: bool) -> None:
        """Correct the reservation; `dispatched=False` refunds the request entirely.

        Synchronous, so it completes even while the request is being cancelled: the
        store records the correction and does any I/O on its own schedule.
        """
        if ticket.settled:
            return
        ticket.settled = True
        used = entry.prompt_tokens + entry.completion_tokens
        used += entry.failed_prompt_tokens + entry.failed_completion_tokens
        token_delta = (used if dispatched else 0) - ticket.reserved
        self.ledger.add(entry)
        if ticket.hold is not None and self.spend is not None:
            actual = Amount(entry.cost_nanos or 0, entry.tokens) if dispatched else ZERO
            self.spend.settle(ticket.hold, actual)
        self.store.settle(ticket.key, ticket.limits, token_delta, 0 if dispatched else -1)


def _refusal(decision: Decision, limit: str, cost: int, limits: Limits) -> RateLimited:
    headers = ratelimit_headers(decision)
    if decision.too_large:
        return RateLimited(
            f"This request needs about {cost} tokens (prompt estimate + the output reserved "
            f"for it), more than this key's whole allowance of {limits.tokens_per_minute} "
            "tokens per minute; "
            "lower max_tokens or shorten the prompt, or ask for a higher limit.",
            param="max_tokens",
            retry_after=60.0,
            should_retry=False,
            headers=headers,
        )
    per = limits.requests_per_minute if limit == "requests" else limits.tokens_per_minute
    return RateLimited(
        f"Rate limit reached for {limit} per minute (limit {per}); "
        f"retry in {decision.retry_after:.2f}s.",
        retry_after=decision.retry_after,
        should_retry=decision.retry_after <= 20,
        headers=headers,
    )


def ratelimit_headers(d: Decision) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(d.requests_limit),
        "x-ratelimit-remaining-requests": str(d.requests_remaining),
        "x-ratelimit-reset-requests": duration(d.requests_reset),
        "x-ratelimit-limit-tokens": str(d.tokens_limit),
        "x-ratelimit-remaining-tokens": str(d.tokens_remaining),
        "x-ratelimit-reset-tokens": duration(d.tokens_reset),
    }


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if not math.isfinite(seconds) or seconds <= 0:
        return "0s"
    ms = math.ceil(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60000)
    secs = f"{rest / 1000:g}s"
    return f"{minutes}m{secs}" if minutes else secs
