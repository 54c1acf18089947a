"""Spend alerts: the webhooks told when a budget passes a threshold, resets, or a model
without a price is served."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from app.config.section import PositiveInt, Section

AlertEvent = Literal["budget_threshold", "budget_reset", "unpriced_model"]
ALERT_EVENTS: tuple[AlertEvent, ...] = ("budget_threshold", "budget_reset", "unpriced_model")


class WebhookConfig(Section):
    url: str = Field(
        pattern=r"^https?://",
        description="Where alerts are POSTed (`http://` or `https://`).",
    )
    format: Literal["json", "slack"] = Field(
        "json",
        description="`json`: the event as an object (see docs/billing.md, Spend alerts); `slack`: "
        '`{"text": ...}`, which a Slack (or Mattermost, Teams workflow) incoming webhook takes.',
    )
    events: list[AlertEvent] = Field(
        default_factory=lambda: list(ALERT_EVENTS),
        description="Which events this webhook gets: `budget_threshold`, `budget_reset`, "
        "`unpriced_model` (default all).",
    )


class AlertsConfig(Section):
    webhooks: list[WebhookConfig] = Field(
        default_factory=list, description="Webhooks told of spend events; none: no alerts."
    )
    thresholds: list[int] = Field(
        default_factory=lambda: [50, 80, 100],
        description="Percentages of every budget (each key's and team's, each period and "
        "metric) that raise a `budget_threshold` alert, once per budget, threshold and period "
        "across all replicas.",
    )
    secret_env: str = Field(
        "TOKENGATE_ALERTS_SECRET",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the HMAC-SHA256 key each body is signed with "
        "(`x-tokengate-signature: sha256=<hex>`); with webhooks configured, an empty or "
        "missing secret refuses to start.",
    )
    max_attempts: PositiveInt = Field(
        8, description="Deliveries of one alert tried at most this often, then marked failed."
    )
    backoff_ms: PositiveInt = Field(
        1000,
        description="First retry wait; doubling, with full jitter (the upstream retry policy).",
    )
    max_backoff_ms: PositiveInt = Field(300000, description="Longest wait between retries.")
    timeout_ms: PositiveInt = Field(10000, description="One delivery's timeout.")
    lease_sec: float = Field(
        30.0,
        gt=0,
        description="A delivery a replica began and never finished (it died) is sent again by "
        "another replica, or the restarted one, after this.",
    )
    check_interval_sec: float = Field(
        5.0, gt=0, description="How often budgets are checked and pending alerts sent."
    )

    @field_validator("thresholds")
    @classmethod
    def _percentages(cls, value: list[int]) -> list[int]:
        if any(not 1 <= t <= 1000 for t in value):
            raise ValueError("thresholds are percentages between 1 and 1000")
        return sorted(set(value))
