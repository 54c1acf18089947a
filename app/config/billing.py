"""Prices, budgets and teams: what a request costs and how much a key or team may spend."""

from __future__ import annotations

from typing import Annotated, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from app.config.section import Money, OnShort, PositiveInt, Section, TeamName
from app.kinds import BudgetPeriod


class BudgetConfig(Section):
    period: BudgetPeriod = Field(
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


Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = get_args(Weekday)
DAY_MINUTES, WEEK_MINUTES = 1440, 7 * 1440
WindowName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
ClockTime = Annotated[str, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$")]


class WindowConfig(Section):
    days: list[Weekday] = Field(
        default_factory=lambda: list(WEEKDAYS),
        min_length=1,
        description="Days of the week the window starts on (`mon` ... `sun`); default every "
        "day. A window crossing midnight belongs to the day it starts on.",
    )
    start: ClockTime = Field(description="Local time it starts, `HH:MM` in `billing.timezone`.")
    end: ClockTime = Field(
        description="Local time it ends (exclusive), `HH:MM` or `24:00`; earlier than `start`: "
        "the window crosses midnight into the next day; equal to `start`: 24 hours."
    )

    def spans(self) -> list[tuple[int, int]]:
        """Minutes of the week it covers, `[from, to)` from Monday 00:00 local; a span may
        run past the week's end (`to` > WEEK_MINUTES: it wraps into Monday)."""
        start, end = _minutes(self.start), _minutes(self.end)
        length = (end - start) % DAY_MINUTES or DAY_MINUTES
        firsts = sorted({WEEKDAYS.index(d) * DAY_MINUTES + start for d in self.days})
        return [(first, first + length) for first in firsts]


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


class PriceChange(Section):
    """A model's price in one window or service tier: only what differs from its own."""

    input: Money | None = Field(None, description="Price of a million prompt tokens there.")
    output: Money | None = Field(None, description="Price of a million completion tokens there.")
    cached_input: Money | None = Field(
        None, description="Price of a million cached prompt tokens there."
    )
    cache_write: Money | None = Field(
        None, description="Price of a million prompt tokens written to the cache there."
    )


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
    windows: dict[WindowName, PriceChange] = Field(
        default_factory=dict,
        description="Prices in named `billing.windows` that differ from this one: "
        '`{"offpeak": {"input": 0.135, "output": 0.55}}`. What a window leaves out is as the '
        "model sets it (`cached_input`/`cache_write` set nowhere: the window's `input`).",
    )

    tiers: dict[WindowName, PriceChange] = Field(
        default_factory=dict,
        description="Prices per service tier the upstream reports it served (the answer's "
        '`service_tier`) that differ from this one: `{"flex": {"input": 1.25, "output": 5}, '
        '"priority": {"input": 4.25, "output": 17}}`. A tier\'s fields win over a window\'s.',
    )

    def priced(self, window: str | None = None, tier: str | None = None) -> PriceConfig:
        """The price in `window` for `tier`: the model's fields, then the window's, then
        the tier's (a field set nowhere keeps the model's)."""
        fields: dict[str, object] = {"windows": {}, "tiers": {}}
        for change in (self.windows.get(window or ""), self.tiers.get(tier or "")):
            if change is not None:
                fields |= change.model_dump(exclude_none=True)
        return self.model_copy(update=fields)


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
    windows: dict[WindowName, WindowConfig] = Field(
        default_factory=dict,
        description="Named time windows in `billing.timezone` (e.g. peak and off-peak hours): "
        '`{"offpeak": {"start": "00:30", "end": "08:30"}}`. Windows may not overlap; outside '
        "every window a request is priced at the base price (window `-`). A request is priced "
        "by the window in force when the upstream finished serving it.",
    )

    @model_validator(mode="after")
    def _windows_fit(self) -> BillingConfig:
        owner: dict[int, str] = {}
        for name, window in self.windows.items():
            for first, after in window.spans():
                for minute in range(first, after):
                    other = owner.setdefault(minute % WEEK_MINUTES, name)
                    if other != name:
                        raise ValueError(f"billing windows {other!r} and {name!r} overlap")
        for model, price in self.prices.items():
            for name in price.windows:
                if name not in self.windows:
                    raise ValueError(
                        f"billing.prices[{model!r}] names window {name!r}, which "
                        f"billing.windows does not define"
                    )
        return self

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
