"""What a request may generate, held against budgets and enforced upstream.

    admission ─► ask(call, model)   the prompt estimate + the WHOLE output allowance
                                    (`max_tokens` / `max_completion_tokens` /
                                    `max_output_tokens`, else `default_max_tokens`), in
                                    tokens and in cost at the dearest price of the model
                                    and the fallbacks it may be served by, in the billing
                                    window in force (and in the next one, if it begins
                                    before the request could be served: queue wait plus
                                    the upstream's time)
    held ─────► cap(call, hold)     the output cap the gateway sends upstream: what the
                                    budgets held (`on_short = "cap"` may have lowered it),
                                    or, for a request that set none, the allowance held

A budget is only as good as the cap the upstream obeys, so a request held against a
budget (and a background response, charged its allowance before it is done) always goes
upstream with an explicit cap. The rate limits keep their own, trainable reservation
(`holds.py`): a tokens-per-minute limit is about throughput, a budget about money.

A key or team with a cost budget is never served by an unpriced model: refused up
front (403 `model_not_priced`, spend.py), and such a fallback is skipped (`serves`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.billing.budget_rules import Amount, Ask
from app.billing.prices import Price, PriceList
from app.billing.spend import Hold, SpendGate
from app.billing.timetable import NO_WINDOW, Timetable
from app.pipeline.plan import Planner
from app.pipeline.request import EMBEDDINGS, ClientRequest

_SCALE = 10**6  # `Price.rates` are in 1e-6 nano-units per token

Rates = tuple[int, int]  # (input, output) per token, in 1e-6 nano-units
_NONE = (NO_WINDOW,)


class Allowance:
    def __init__(self, planner: Planner, clock: Callable[[], float] = time.time) -> None:
        self.planner = planner
        self.clock = clock  # the wall clock billing windows are read on
        self.spend: SpendGate | None = None
        self.timetable = Timetable({})
        self.horizon = 0.0
        self._rates: dict[str | tuple[str, tuple[str, ...]], Rates | None] = {}

    def configure(
        self,
        prices: PriceList,
        default_max_tokens: int,
        timetable: Timetable | None = None,
        horizon: float = 0.0,
    ) -> None:
        """`horizon`: how long after admission a request may still be served (the most it
        may queue plus the upstream's time), so a window beginning that soon is priced in."""
        self.prices = prices
        self.default_max_tokens = default_max_tokens
        self.timetable = timetable if timetable is not None else Timetable({})
        self.horizon = horizon
        self._rates = {}

    def ask(self, call: ClientRequest, model: str) -> tuple[Ask, bool]:
        """What `call` may consume served by `model` (or a fallback), and whether it is
        priced (False: its cost is unknowable)."""
        prompt, choices = call.prompt_tokens, call.choices
        if call.endpoint is EMBEDDINGS:
            most = 0
        else:
            most = call.max_tokens if call.max_tokens is not None else self.default_max_tokens
        rates = self._rates_of(model)
        if rates is None:
            return Ask(Amount(0, prompt), Amount(0, choices), most), False
        rate_in, rate_out = rates
        base = Amount(-(-prompt * rate_in // _SCALE), prompt)
        return Ask(base, Amount(-(-rate_out * choices // _SCALE), choices), most), True

    def _rates_of(self, model: str) -> Rates | None:
        """The dearest input and output rates of `model` and the priced fallbacks (a
        fallback is a re-send: the hold must cover it) in the windows that may be in force
        when it is served; None when `model` has none."""
        timetable = self.timetable
        windows = timetable.ahead(self.clock(), self.horizon) if timetable else _NONE
        cached = (model, windows) if timetable else model  # no windows: no tuple per request
        if cached in self._rates:
            return self._rates[cached]
        rates: Rates | None = None
        if self.prices.price(model) is not None:
            for window in windows:
                for name in (model, *self.planner.fallback_models()):
                    price = self.prices.price(name, window=window)
                    if price is not None:
                        rates = _dearer(rates, price)
        self._rates[cached] = rates
        return rates

    def cap(self, call: ClientRequest, hold: Hold | None) -> None:
        """Set the output cap sent upstream: what the budgets held, or, for a background
        response, the allowance it is charged (OpenAI's API has no default cap)."""
        if call.endpoint is EMBEDDINGS:
            return
        if hold is not None:
            if call.max_tokens is None or hold.cap < call.max_tokens:
                call.max_tokens, call.send_cap = hold.cap, True
        elif call.max_tokens is None and call.background:
            call.max_tokens, call.send_cap = self.default_max_tokens, True

    def serves(self, call: ClientRequest, model: str) -> bool:
        """May `model` serve `call` as a fallback: not an unpriced model for a key or
        team with a cost budget (its spend would escape the budget)."""
        if self.spend is None or self.prices.price(model) is not None:
            return True
        return not self.spend.costs(call.key)


def _dearer(rates: Rates | None, price: Price) -> Rates:
    if rates is None:
        return (price.rates[0], price.rates[1])
    return (max(rates[0], price.rates[0]), max(rates[1], price.rates[1]))
