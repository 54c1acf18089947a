"""The gateway's closed vocabularies, as enums.

Each is a `StrEnum`, so the configuration files, JSON bodies, metric labels and log
lines keep the plain words (`"high"`, `"anthropic"`, `"prompt"`), while the code gets a
typo-proof name and mypy can check a `match` over every member. This module imports
nothing of the app: the configuration (the bottom layer) and everything above use it.
"""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    """A key's queue class (settings.json `keys[].priority`)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class QueueClass(StrEnum):
    """Where a request waits in a domain queue, served in this order: a key's priority,
    then `batch` (Batch API items), which runs only on capacity interactive traffic
    leaves."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    BATCH = "batch"

    @classmethod
    def of(cls, priority: Priority) -> QueueClass:
        return _QUEUE_OF[priority]  # once per request: a lookup, not an enum call


INTERACTIVE = (QueueClass.HIGH, QueueClass.NORMAL, QueueClass.LOW)
_QUEUE_OF = {p: QueueClass(p.value) for p in Priority}


class ServiceTier(StrEnum):
    """OpenAI's `service_tier` of a request (and of the answer: the tier that served it).

    Passed upstream to a domain that declares it serves the tier (`[[scale_up]]
    service_tiers`); elsewhere the gateway serves it with its own queue classes:
    `priority` in `high`, `flex` in `batch` (spare capacity only, a longer queue wait),
    `auto` and `default` in the key's own class."""

    AUTO = "auto"
    DEFAULT = "default"
    FLEX = "flex"
    PRIORITY = "priority"


class BudgetPeriod(StrEnum):
    """The calendar period a budget counts over (`budgets[].period`), in
    `billing.timezone`."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"  # never resets


class BudgetMetric(StrEnum):
    """What a budget caps: `cost` (nano-units of `billing.currency`) or `tokens`."""

    COST = "cost"
    TOKENS = "tokens"


class BudgetScope(StrEnum):
    """Whose budget: a key's, or a team's (every key of the team together)."""

    KEY = "key"
    TEAM = "team"


class ApiStyle(StrEnum):
    """Which API a domain's upstream speaks (`[[scale_up]] api_style`)."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    BOTH = "both"

    def speaks(self, anthropic: bool) -> bool:
        """True if a request in Anthropic's dialect (or OpenAI's) can go to this upstream."""
        wanted = ApiStyle.ANTHROPIC if anthropic else ApiStyle.OPENAI
        return self is ApiStyle.BOTH or self is wanted


class DomainState(StrEnum):
    """What a domain is doing, worst first (`/health/ready` and `/admin/status` show it;
    the status page alerts on it): its breaker open, its probe failing, its upstream
    account empty, cooling down after a 429, healthy, or not probed yet."""

    CIRCUIT_OPEN = "circuit_open"
    UNHEALTHY = "unhealthy"
    QUOTA_EXHAUSTED = "quota_exhausted"
    THROTTLED = "throttled"
    HEALTHY = "healthy"
    UNKNOWN = "unknown"


class TokenKind(StrEnum):
    """The `kind` label of the token counters."""

    PROMPT = "prompt"
    COMPLETION = "completion"


class BatchStatus(StrEnum):
    """A Batch API job's `status`, as OpenAI names them (`validating` and `failed` are
    OpenAI's too: a batch this gateway cannot run is refused at creation instead)."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


RUNNING_BATCH = (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING)


class ItemState(StrEnum):
    """One request of a batch (a row of `items`): `pending` until its answer is stored."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class DeferOutcome(StrEnum):
    """The `outcome` label of `tokengate_deferred_total`: work held for a window or for
    idle quota, released in it, or released early so as not to miss its deadline."""

    HELD = "held"
    RELEASED = "released"
    EARLY_RELEASED = "early_released"
