"""Cost of a request from its usage, exact to the nano-unit, computed by hand here."""

from __future__ import annotations

from decimal import Decimal

from app.billing.prices import NANOS, PriceList, Tokens, amount, render, to_nanos
from app.config.schema import PriceConfig

# Per million tokens: input 2.50, output 10.00, cached 1.25, cache write 3.75
GPT = PriceConfig(input=Decimal("2.5"), output=Decimal("10"), cached_input=Decimal("1.25"))
CLAUDE = PriceConfig(
    input=Decimal("3"),
    output=Decimal("15"),
    cached_input=Decimal("0.30"),
    cache_write=Decimal("3.75"),
)
PRICES = PriceList({"gpt-4o": GPT, "claude-sonnet": CLAUDE})


def test_openai_cached_tokens_are_part_of_the_prompt_and_priced_once_at_their_rate() -> None:
    # 1200 prompt tokens of which 1024 cached, 300 completion (reasoning included):
    # 176 x 2.5 + 1024 x 1.25 + 300 x 10 = 440 + 1280 + 3000 = 4720 per million
    cost = PRICES.cost(Tokens(prompt=1200, completion=300, cached=1024), "gpt-4o")
    assert cost == 4720 * 1000  # nano-units: 0.00472
    assert render(cost) == "0.00472"


def test_anthropic_cache_reads_and_writes_each_have_their_price() -> None:
    # usage.py makes the prompt input + read + write: 100 + 2000 + 500
    tokens = Tokens(prompt=2600, completion=50, cached=2000, cache_write=500)
    # 100 x 3 + 2000 x 0.30 + 500 x 3.75 + 50 x 15 = 300 + 600 + 1875 + 750 = 3525
    assert PRICES.cost(tokens, "claude-sonnet") == 3_525_000


def test_unset_cache_prices_fall_back_to_the_input_price() -> None:
    plain = PriceList({"m": PriceConfig(input=Decimal("1"), output=Decimal("2"))})
    # every prompt token at 1, whatever the cache did
    assert plain.cost(Tokens(1000, 10, cached=600, cache_write=400), "m") == (1000 + 20) * 1000


def test_cache_counts_beyond_the_prompt_are_not_believed() -> None:
    assert PRICES.cost(Tokens(10, 0, cached=50), "gpt-4o") == 10 * 1250


def test_a_fraction_of_a_nano_unit_is_rounded_once_half_to_even() -> None:
    cheap = PriceList({"m": PriceConfig(input=Decimal("0.0375"), output=Decimal("0"))})
    assert cheap.cost(Tokens(1, 0), "m") == 38  # 37.5 -> 38 (even)
    assert cheap.cost(Tokens(3, 0), "m") == 112  # 112.5 -> 112 (even)


def test_the_first_named_model_with_a_price_prices_it_and_none_is_unknown() -> None:
    assert PRICES.cost(Tokens(1_000_000, 0), None, "gpt-4o") == to_nanos(Decimal("2.5"))
    assert PRICES.cost(Tokens(1_000_000, 0), "gpt-4o-2024-08-06", "gpt-4o") == 2_500_000_000
    assert PRICES.cost(Tokens(10, 10), "mystery") is None
    assert PRICES.unpriced(["gpt-4o", "mystery", "b"]) == ["b", "mystery"]


def test_amounts_render_exactly_without_exponents() -> None:
    assert render(0) == "0"
    assert render(7) == "0.000000007"
    assert render(12 * NANOS + 500_000_000) == "12.5"
    assert amount(4_720_000) == 0.00472
    assert to_nanos(Decimal("100.000000001")) == 100 * NANOS + 1
