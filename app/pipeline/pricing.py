"""What a request costs: the price list, and the billing window in force as it finishes.

    Pricing.cost(trace, failed, window)   nano-units of `currency` for what the request
                                          consumed (failed attempts' tokens included), at
                                          the price of the model the gateway sent, else
                                          the one the upstream named; None: no price
    Pricing.window()                      the window in force now (`-`: none)
    Pricing.spend_text(nanos)             `x-tokengate-cost`: `0.000123 USD` | `unknown`

Taken from `billing.*` at start and on reload (`configure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.billing.prices import PriceList, Tokens, render
from app.billing.timetable import NO_WINDOW, Timetable
from app.config.schema import BillingConfig
from app.pipeline.trace import Trace


class Pricing:
    def __init__(self, billing: BillingConfig, wall_clock: Callable[[], float] = time.time):
        self.wall_clock = wall_clock  # billing windows are read on it
        self.configure(billing)

    def configure(self, billing: BillingConfig) -> None:
        self.prices = PriceList(billing.prices, billing.currency)
        self.timetable = Timetable(billing.windows, billing.timezone)

    @property
    def currency(self) -> str:
        return self.prices.currency

    def window(self) -> str:
        """The billing window in force now (`-`: none, or no windows configured)."""
        timetable = self.timetable
        return timetable.name_at(self.wall_clock()) if timetable else NO_WINDOW

    def cost(self, trace: Trace, failed: tuple[int, int], window: str) -> int | None:
        tokens = Tokens(
            trace.prompt_tokens + failed[0],
            trace.completion_tokens + failed[1],
            trace.cached_tokens,
            trace.cache_write_tokens,
        )
        if not (tokens.prompt or tokens.completion):
            return 0  # nothing consumed costs nothing, priced or not
        sent = trace.attempts[-1].model if trace.attempts else None
        return self.prices.cost(tokens, sent, trace.model, window=window, tier=trace.service_tier)

    def spend_text(self, nanos: int | None) -> str:
        """`x-tokengate-cost`: `0.000123 USD`, or `unknown` for a model without a price."""
        return "unknown" if nanos is None else f"{render(nanos)} {self.prices.currency}"
