"""Prices, budgets and teams: what a request costs and how much a key or team may spend."""

from __future__ import annotations

from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from app.config.section import Money, OnShort, PositiveInt, Section, TeamName


class BudgetConfig(Section):
    period: Literal["day", "week", "month", "total"] = Field(
        description="Calendar period the budget counts over, in `billing.timezone`: `day` "
        "(from local midnight), `week` (ISO week, from Monday), `month` (from the 1st) or "
        "`total` (never resets)."
    )
    max_cost: Money | None = Field(
        None,
        description="Most spend per period, in `billing.currency` (cost from `billing.prices`).",
    )
    max_tokens: PositiveInt | None = Field(
        None, description="Most tokens per period (prompt + completion, cached counted once)."
    )
    on_short: OnShort = Field(
        "refuse",
        description="A request reserves its whole output allowance (`max_tokens`, else "
        "`rate_limit.default_max_tokens`, which the gateway then sends upstream); when less "
        "than that is left: `refuse` (429 `budget_exceeded`) or `cap` (the output cap sent "
        "upstream is lowered to what is left; refused only when not one token is).",
    )

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetConfig:
        if self.max_cost is None and self.max_tokens is None:
            raise ValueError("a budget needs `max_cost` or `max_tokens` (or both)")
        return self


class PriceConfig(Section):
    input: Money = Field(description="Price of a million prompt tokens (not cached).")
    output: Money = Field(description="Price of a million completion tokens (reasoning included).")
    cached_input: Money | None = Field(
        None,
        description="Price of a million prompt tokens read from the upstream's prompt cache; "
        "unset: the `input` price.",
    )
    cache_write: Money | None = Field(
        None,
        description="Price of a million prompt tokens written to the prompt cache (Anthropic's "
        "cache creation); unset: the `input` price.",
    )


class BillingConfig(Section):
    currency: str = Field(
        "USD",
        pattern=r"^[A-Z]{3}$",
        description="ISO 4217 code every price and `max_cost` is in (`USD`, `CNY`, ...).",
    )
    timezone: str = Field(
        "UTC",
        description="IANA time zone of the calendar periods (budgets' day/week/month, daily "
        "reports), e.g. `Asia/Shanghai`.",
    )
    prices: dict[str, PriceConfig] = Field(
        default_factory=dict,
        description="Prices per model (the name after `model_aliases`), per million tokens: "
        '`{"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25}}`. A model without '
        "a price is warned about at start; its cost is recorded as unknown.",
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as UTC or Asia/Shanghai"
            ) from None
        return value


class TeamConfig(Section):
    name: TeamName = Field(description="Team name, referred to by keys' `team`.")
    budgets: list[BudgetConfig] = Field(
        default_factory=list,
        description="The team's budgets: the spend of all its keys together.",
    )
