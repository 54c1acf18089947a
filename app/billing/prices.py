"""Prices and the cost of one request, exact to the nano-unit.

Money is an integer count of nano-units (1e-9 of `billing.currency`) wherever it is
stored or added up, so a month of requests sums exactly in SQL and in Python. A price
is per million tokens, so one token at price P costs P x 1000 nano-units. Prices have
at most 9 decimals (the configuration says so), so a request's cost is exact in
integers of 1e-6 nano-unit (`_SCALE`) and rounded once, half to even, to a whole
nano-unit: integer arithmetic, a fraction of the cost of `Decimal` on the request path.

Which tokens are which (each prompt token is counted once, in cost as in the limits):

    prompt       every prompt token: OpenAI's `prompt_tokens`; Anthropic's `input_tokens`
                 + `cache_read_input_tokens` + `cache_creation_input_tokens` (usage.py)
    cached       of the prompt, read from the upstream's prompt cache -> `cached_input`
    cache_write  of the prompt, written to the cache (Anthropic)      -> `cache_write`
    the rest of the prompt                                            -> `input`
    completion   reasoning tokens included (OpenAI counts them in `completion_tokens`,
                 Anthropic in `output_tokens`)                        -> `output`

Which model's price: the model the gateway sent upstream (the name after
`model_aliases`, or the fallback that served), else the name the upstream answered
with, so a dated snapshot (`gpt-4o-2024-08-06`) may also be priced on its own. A model
with neither has no price: its cost is unknown (`None`), never zero.

Which window's price: a model may price named `billing.windows` differently
(`PriceConfig.windows`); the caller says which window the request was served in
(`app.billing.timetable`), and outside those the model's own price holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal

from app.config.schema import PriceConfig

NANOS = 10**9  # nano-units per currency unit
_SCALE = 10**6  # a token's price is kept in 1e-6 nano-units: price per million x 1e9


@dataclass(slots=True, init=False)
class Tokens:
    """What one request consumed, each token once (see the module docstring).

    (Built on every request: its `__init__` is written out, so the compiled build runs it
    as C; docs/development.md, "The compiled build", says why.)"""

    prompt: int
    completion: int
    cached: int
    cache_write: int

    def __init__(self, prompt: int, completion: int, cached: int = 0, cache_write: int = 0) -> None:
        self.prompt = prompt
        self.completion = completion
        self.cached = cached
        self.cache_write = cache_write


@dataclass(frozen=True)
class Price:
    """Per million tokens, in the billing currency."""

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write: Decimal
    # per token in 1e-6 nano-units: input, output, cached input, cache write
    rates: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    @classmethod
    def of(cls, cfg: PriceConfig) -> Price:
        return cls(
            cfg.input,
            cfg.output,
            cfg.input if cfg.cached_input is None else cfg.cached_input,
            cfg.input if cfg.cache_write is None else cfg.cache_write,
        )

    def __post_init__(self) -> None:
        rates = (self.input, self.output, self.cached_input, self.cache_write)
        object.__setattr__(self, "rates", tuple(_fine(r) for r in rates))

    def cost(self, tokens: Tokens) -> int:
        """Nano-units; cached and written tokens beyond the prompt are not believed."""
        prompt = max(0, tokens.prompt)
        cached = min(max(0, tokens.cached), prompt)
        written = min(max(0, tokens.cache_write), prompt - cached)
        rate_in, rate_out, rate_cached, rate_write = self.rates
        fine = (
            (prompt - cached - written) * rate_in
            + cached * rate_cached
            + written * rate_write
            + max(0, tokens.completion) * rate_out
        )
        whole, rest = divmod(fine, _SCALE)
        half = _SCALE // 2
        return whole + 1 if rest > half or (rest == half and whole % 2) else whole


class PriceList:
    def __init__(self, prices: Mapping[str, PriceConfig], currency: str = "USD") -> None:
        self.currency = currency
        self._prices = {model: Price.of(cfg) for model, cfg in prices.items()}
        # (model, window, tier) -> its price there, where it differs from the model's own
        self._variants = {
            (model, window, tier): Price.of(cfg.priced(window, tier))
            for model, cfg in prices.items()
            for window in (None, *cfg.windows)
            for tier in (None, *cfg.tiers)
            if window is not None or tier is not None
        }

    def __bool__(self) -> bool:
        return bool(self._prices)

    def price(
        self, *models: str | None, window: str | None = None, tier: str | None = None
    ) -> Price | None:
        """The price of the first of `models` that has one, in `window` (a name from
        `app.billing.timetable`; `-` or None: none) for the service `tier` that served
        it, where the model prices them apart."""
        for model in models:
            if model is not None:
                found = self._prices.get(model)
                if found is not None:
                    if self._variants and (window is not None or tier is not None):
                        return self._variant(model, window, tier) or found
                    return found
        return None

    def _variant(self, model: str, window: str | None, tier: str | None) -> Price | None:
        variants = self._variants
        return (
            variants.get((model, window, tier))
            or variants.get((model, None, tier))
            or variants.get((model, window, None))
        )

    def cost(
        self,
        tokens: Tokens,
        *models: str | None,
        window: str | None = None,
        tier: str | None = None,
    ) -> int | None:
        """Nano-units, or None when no model named has a price (cost unknown)."""
        price = self.price(*models, window=window, tier=tier)
        return None if price is None else price.cost(tokens)

    def unpriced(self, models: Iterable[str]) -> list[str]:
        return sorted({m for m in models if m not in self._prices})


def _fine(price: Decimal) -> int:
    """A price per million tokens as 1e-6 nano-units per token (exact to 9 decimals)."""
    return int(price * NANOS)


def to_nanos(amount: Decimal) -> int:
    return int((amount * NANOS).to_integral_value(rounding=ROUND_HALF_EVEN))


def render(nanos: int) -> str:
    """Exact decimal text of an amount (`0.0000075`, `12.5`, `0`), no exponent."""
    text = f"{Decimal(nanos).scaleb(-9):f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def amount(nanos: int) -> float:
    """For JSON numbers and Prometheus (exact up to 15 significant digits)."""
    return float(Decimal(nanos).scaleb(-9))
