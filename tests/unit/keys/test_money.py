"""Money: calendar periods in UTC, amounts in cents as Anthropic writes them, prices by name."""

from __future__ import annotations

import datetime

from dragoman.core.config import Price as PriceConfig
from dragoman.keys.money import Prices, bucket, budget_nanodollars, cents, window
from dragoman.keys.records import Budget


def _at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def test_periods_are_calendar_periods_in_utc() -> None:
    assert window("day", _at("2026-12-06T23:59:59+00:00"))[1:] == (
        _at("2026-12-06T00:00:00+00:00"),
        _at("2026-12-07T00:00:00+00:00"),
    )
    assert window("week", _at("2026-12-06T12:00:00+00:00"))[1:] == (
        _at("2026-11-30T00:00:00+00:00"),
        _at("2026-12-07T00:00:00+00:00"),
    )
    assert window("month", _at("2026-12-31T12:00:00+00:00"))[1:] == (
        _at("2026-12-01T00:00:00+00:00"),
        _at("2027-01-01T00:00:00+00:00"),
    )
    assert window("day", _at("2026-12-06T12:00:00-05:00"))[0] == "2026-12-06"  # 17:00 UTC


def test_a_keys_money_bucket_is_one_want_for_a_minute_and_outlives_its_period() -> None:
    """Requests within a minute ask the same `Want` (a Redis store encodes it once, not once per
    request), and its ttl always reaches a minute past the period's end."""
    budget = Budget(amount="100", period="day")
    first, later = (
        bucket("key_1", budget, _at(t)) for t in ("2026-12-06T10:00:00+00:00", "2026-12-06T10:00:59.9+00:00")
    )
    assert first == later and hash(first) == hash(later)
    assert bucket("key_1", budget, _at("2026-12-06T10:01:00+00:00")) != first
    for moment in ("2026-12-06T10:00:30+00:00", "2026-12-06T23:59:59.5+00:00"):
        now = _at(moment)
        assert now + bucket("key_1", budget, now).ttl >= _at("2026-12-07T00:01:00+00:00")


def test_amounts_are_cents_as_decimal_strings() -> None:
    assert cents(0.0) == "0" and cents(10_000_000) == "1" and cents(105_000) == "0.0105"
    assert budget_nanodollars(Budget(amount="5000")) == 5e10  # $50


def test_prices_are_found_by_name_or_alias_and_unpriced_models_have_none() -> None:
    prices = Prices([("qwen3", ["claude-*", "q"], PriceConfig(input=0.30, output=1.20)), ("free", [], None)])
    price = prices.get("q")
    assert price is not None and price.of(1_000_000, 1_000_000) == 1.5e9  # $1.50
    assert prices.get("free") is None and prices.get("nope", "qwen3") is price


def test_prices_are_found_as_the_router_finds_models_wildcards_included() -> None:
    prices = Prices([("qwen3", ["claude-opus-*", "q"], PriceConfig(input=1.0, output=1.0)), ("free", ["claude-*"], None),
                     ("other", ["claude-opus-*"], PriceConfig(input=9.0, output=9.0))])  # fmt: skip
    qwen3 = prices.get("qwen3")
    assert prices.get("claude-opus-4-5") is qwen3  # the first wildcard that matches, as routing picks
    assert prices.get("claude-haiku-4-5", "qwen3") is None  # served free: a configured model without a price
    assert prices.get("Qwen/Qwen3-32B", "q") is qwen3 and bool(prices)
    assert not Prices([("free", ["*"], None)])


def test_a_name_routed_to_the_default_model_is_priced_by_the_model_id_sent_upstream() -> None:
    config = PriceConfig(input=1.0, output=1.0)
    prices = Prices([("qwen3", [], config, "Qwen/Qwen3-32B"), ("a", [], config, "shared"),
                     ("b", [], PriceConfig(input=2.0, output=2.0), "shared"), ("free", [], None, "gpt-oss")])  # fmt: skip
    assert prices.get("gpt-4", "Qwen/Qwen3-32B") is prices.get("qwen3")
    assert prices.get("gpt-4", "shared") is None and prices.get("gpt-4", "gpt-oss") is None  # two prices; free
