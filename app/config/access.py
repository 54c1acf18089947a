"""The access side (the seed's `settings.json` sections and what tokengate adds to them):
model routes, per-key limits, retries, health probes, the breaker, session affinity and
the gateway keys."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from app.config.billing import BudgetConfig
from app.config.section import DomainName, PositiveInt, ReserveOutput, Section, TeamName
from app.kinds import Priority, ServiceTier


class ModelRouteConfig(Section):
    default: str | None = Field(None, description="Model used when a request names none.")
    fallback: str | list[str] | None = Field(
        None,
        description="Model(s) tried, in order, when the requested model's attempts are "
        "exhausted or no healthy domain serves it.",
    )

    def fallbacks(self) -> tuple[str, ...]:
        if self.fallback is None:
            return ()
        return (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)


class RateLimitConfig(Section):
    tokens_per_minute: PositiveInt = Field(
        120000, description="Default per-key token allowance per minute (prompt + completion)."
    )
    requests_per_minute: PositiveInt = Field(
        600, description="Default per-key request allowance per minute."
    )
    default_max_tokens: PositiveInt = Field(
        1024,
        description="Completion tokens reserved at admission when a request sets no "
        "`max_tokens`; corrected to real usage when the answer ends.",
    )
    reserve_output: ReserveOutput = Field(
        "estimate",
        description="Output tokens a request reserves at admission: `estimate` (a high "
        "percentile, `output_percentile`, of the key's recent completions for that model, "
        "capped by `max_tokens`; `default_max_tokens` until 5 are known) or `max_tokens` "
        "(all of it, OpenAI's rule). Settled to real usage either way; per key too.",
    )
    output_percentile: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Percentile of a key's last 100 completions (per model) reserved when "
        "`reserve_output` is `estimate`.",
    )
    max_concurrent: PositiveInt | None = Field(
        None,
        description="Default most requests a key has in flight at once (streams count until "
        "they end); more wait in the queue up to `max_queue_wait_ms`, then 503. Unset: no cap.",
    )


class RetryPolicyConfig(Section):
    max_attempts: int | None = Field(
        None,
        ge=1,
        le=10,
        description="Upstream attempts per model (first try included). Wins over "
        "`token_scheduler.max_retries`.",
    )
    backoff_ms: PositiveInt = Field(
        500, description="Base of the exponential backoff (full jitter) between attempts."
    )
    max_backoff_ms: PositiveInt = Field(8000, description="Cap of one backoff wait.")
    max_retry_after_ms: PositiveInt = Field(
        20000,
        description="Longest upstream `Retry-After` honoured; a longer one ends retrying at once.",
    )
    budget_ratio: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Retry budget per domain: retries may add at most this fraction of the "
        "requests seen in `budget_window_sec` (plus `budget_min_retries`).",
    )
    budget_window_sec: PositiveInt = Field(10, description="Sliding window of the retry budget.")
    budget_min_retries: int = Field(
        10, ge=0, description="Retries always allowed per window, so a quiet domain can retry."
    )
    client_retries: Literal["cooperate", "client"] = Field(
        "cooperate",
        description="`cooperate`: the gateway retries and tells SDKs not to repeat it "
        "(`x-should-retry: false`); `client`: one gateway attempt, retries left to clients.",
    )
    retry_unanswered: bool = Field(
        False,
        description="Also re-send a request the upstream may have acted on (it was written, "
        "then the connection broke, went silent or answered garbage), here or on a fallback. "
        "Off: such a request is answered 502/504 with `x-should-retry: false`, because a "
        "re-send may run, and bill, it twice; on: availability first, it MAY BILL TWICE.",
    )


class HealthCheckConfig(Section):
    enabled: bool = Field(True, description="Probe each domain in the background.")
    interval_sec: float = Field(30, gt=0, description="Seconds between probes of a domain.")
    endpoint: str = Field("/v1/models", description="Upstream path probed (GET, with the key).")
    timeout_ms: PositiveInt = Field(5000, description="Timeout of one probe.")


class BreakerConfig(Section):
    failure_threshold: PositiveInt = Field(
        5, description="Consecutive upstream failures that open a domain's circuit."
    )
    failure_rate: float = Field(
        0.5, gt=0, le=1, description="Failure fraction over the window that opens the circuit."
    )
    window_sec: PositiveInt = Field(30, description="Window of the failure-rate rule.")
    min_requests: PositiveInt = Field(
        20, description="Requests in the window before the failure-rate rule applies."
    )
    open_sec: float = Field(
        10, gt=0, description="Seconds a circuit stays open before a half-open probe."
    )


class AffinityConfig(Section):
    enabled: bool = Field(
        True,
        description="Send the requests of one conversation to the same domain (its upstream "
        "prompt cache then serves their shared prefix) while it is available and not "
        "overloaded; off: the least expected wait.",
    )
    load_factor: float = Field(
        1.25,
        ge=1,
        le=10,
        description="A domain holding more than this many times its weighted share of the "
        "active conversations takes no new ones (they go to their next choice); one request "
        "of a conversation goes elsewhere while its domain has requests queued and is this "
        "far over its share of the outstanding requests.",
    )


class SessionsConfig(Section):
    max_per_key: int = Field(
        64,
        ge=1,
        le=10_000,
        description="Agent sessions a key may have active at once in the ledger and the session "
        "spend (the client names them, so they are bounded); a new one past it is accounted "
        "as `~other`.",
    )
    idle_sec: float = Field(
        900.0,
        gt=0,
        description="A session not seen this long stops counting as active (for `max_per_key`).",
    )


class KeyConfig(Section):
    alias: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Name of the key in metrics, logs and the ledger (never the secret).",
    )
    key_sha256: str | list[str] = Field(
        description="SHA-256 hex of the key (`tokengate keys new`); a list during rotation.",
    )
    tokens_per_minute: PositiveInt | None = Field(None, description="Overrides the default.")
    requests_per_minute: PositiveInt | None = Field(None, description="Overrides the default.")
    priority: Priority = Field(Priority.NORMAL, description="Queue class: high, normal or low.")
    models: list[str] | None = Field(None, description="Models this key may use; unset = all.")
    domain: DomainName | None = Field(None, description="Pin this key to one domain.")
    reserve_output: ReserveOutput | None = Field(
        None, description="Overrides `rate_limit.reserve_output` for this key."
    )
    max_concurrent: PositiveInt | None = Field(
        None, description="Overrides `rate_limit.max_concurrent` for this key."
    )
    max_websockets: PositiveInt | None = Field(
        None, description="Overrides `server.max_websockets_per_key` for this key."
    )
    expires_at: datetime | None = Field(
        None, description="After this instant (ISO 8601, UTC if no zone) the key gets 401."
    )
    team: TeamName | None = Field(
        None,
        description="The team (one of `teams`) this key belongs to: its spend also counts "
        "against the team's budgets, and reports can group by team.",
    )
    budgets: list[BudgetConfig] = Field(
        default_factory=list,
        description="This key's budgets (`period` and `max_cost` and/or `max_tokens`); past one "
        "the key gets 429 `budget_exceeded` until the period resets.",
    )
    session_budget: BudgetConfig | None = Field(
        None,
        description="Most one agent session of this key may spend per period (`period`, "
        "`max_tokens` and/or `max_cost`): a session (Claude Code's or Codex's session id, or "
        "`prompt_cache_key`) past it gets 429 `session_budget_exceeded` until the period "
        "resets; other sessions of the key go on. Counted per gateway process.",
    )
    service_tiers: list[ServiceTier] | None = Field(
        None,
        description="The `service_tier` values this key may ask for; another gets 403 "
        "`service_tier_not_allowed`. Unset: all of `auto`, `default`, `flex`, `priority`.",
    )
    service_tier: ServiceTier | None = Field(
        None,
        description="Force this tier on every request of the key, whatever it asks for "
        '(`"flex"`: a key for background work that only ever uses spare capacity).',
    )
    defer_window: str | None = Field(
        None,
        description="What this key's batches wait for, over `batch.defer_window`: a window of "
        "`billing.windows`, or `none` (idle upstream quota: they run at once on the capacity "
        "interactive traffic leaves). Unset: `batch.defer_window`.",
    )
    defer_requests: Literal["none", "background", "all"] = Field(
        "none",
        description="Which of this key's requests are deferred besides its batches: "
        "`background`: every background Responses request (answered `queued`, held in the "
        "database for `defer_window` like a batch); `all`: those, and every other request is "
        "served as `service_tier` `flex` (spare capacity only, up to "
        "`flex_max_queue_wait_ms`). `none`: only a background request that asks "
        '(`metadata.tokengate_defer = "true"`).',
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | list[str]) -> str | list[str]:
        for digest in [value] if isinstance(value, str) else value:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("must be 64 lowercase hex characters (a SHA-256 digest)")
        return value

    def digests(self) -> tuple[str, ...]:
        return (self.key_sha256,) if isinstance(self.key_sha256, str) else tuple(self.key_sha256)
