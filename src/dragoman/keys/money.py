"""Money budgets: a key's spend per calendar day, week (from Monday) or month, UTC, priced
by `[[models]] price` (USD per million tokens) and counted in nano-dollars.

A request reserves its most (its input estimated from its size, and `max_tokens`) when it
starts and is settled with its real usage when it ends, however it ends, as the output-token
bucket is. The bucket is counted in the limits' store (Redis when configured, in the same
round trip). It holds SPAN nano-dollars and starts full; a request is admitted while the
spend (SPAN - level) is below the budget, so a changed budget keeps what was spent.
A process that has not counted a period yet charges it with what the ledger says was spent
(`keys.seeding`), only where the store holds nothing for it."""

from __future__ import annotations

import datetime
import fnmatch
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from dragoman.calls.types import Call, Outcome, max_tokens
from dragoman.core.config import ModelConfig
from dragoman.keys.records import Budget, Grant
from dragoman.limits.gate import Extra, LimitReached, rfc3339
from dragoman.limits.store import Want, kept_until

NANO = 1_000  # nano-dollars per token for a price of 1 USD per million tokens
SPAN = 4e15  # a budget bucket's capacity in nano-dollars ($4M): exact in a double, more than any budget
MOST_CENTS = 100_000_000  # the largest budget accepted ($1M)
MOST_NAMES = 10_000  # names a Prices remembers it matched by a wildcard


@dataclass(frozen=True, slots=True)
class Price:
    """Nano-dollars per token."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    def of(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        return (input_tokens * self.input + output_tokens * self.output + cache_read * self.cache_read
                + cache_write * self.cache_write)  # fmt: skip


class Prices:
    """The price of each configured model, by its name and its aliases, wildcards too, found as
    the router finds the model (exact names first, then wildcards in order); a configured model
    without a price is found, and free. Last, by the model id sent upstream (`served`, where
    the models serving it agree on a price): what a name routed to `default_model` costs."""

    def __init__(
        self, models: Iterable[tuple[str, Iterable[str], object] | tuple[str, Iterable[str], object, str]]
    ) -> None:
        self._by_name: dict[str, Price | None] = {}
        self._patterns: list[tuple[str, Price | None]] = []
        served: dict[str, set[Price | None]] = {}
        for name, aliases, price, *upstream in models:
            each = None
            if price is not None:
                each = Price(*(getattr(price, f) * NANO for f in ("input", "output", "cache_read", "cache_write")))
            for alias in (name, *aliases):
                if "*" in alias or "?" in alias:
                    self._patterns.append((alias, each))
                else:
                    self._by_name.setdefault(alias, each)
            for model_id in upstream:
                served.setdefault(model_id, set()).add(each)
        self._served = {i: next(iter(p)) for i, p in served.items() if len(p) == 1 and None not in p}
        self._priced = any(p is not None for p in (*self._by_name.values(), *(p for _, p in self._patterns)))

    @staticmethod
    def of(models: Iterable[ModelConfig]) -> Prices:
        return Prices((m.name, m.aliases, m.price, m.served_model) for m in models)

    def __bool__(self) -> bool:
        return self._priced

    def get(self, *names: str) -> Price | None:
        """The first of `names` that is a configured model's: its price (None: free); else the
        price of the first that is a model id sent upstream."""
        for name in names:
            if name in self._by_name:
                return self._by_name[name]
            for pattern, price in self._patterns:
                if fnmatch.fnmatchcase(name, pattern):
                    if len(self._by_name) < MOST_NAMES:  # client names, bounded: later ones are matched again
                        self._by_name[name] = price
                    return price
        return next((self._served[n] for n in names if n in self._served), None)


def cents(nanodollars: float) -> str:
    """An amount as Anthropic's reports give it: cents, as a decimal string."""
    return format(Decimal(repr(nanodollars)) / Decimal(10_000_000), "f").rstrip("0").rstrip(".") or "0"


def budget_nanodollars(budget: Budget) -> float:
    return _nanodollars(budget.amount)


@functools.lru_cache(maxsize=1024)
def _nanodollars(amount: str) -> float:
    """(Cached: every request with a budget asks, and keys share a few amounts.)"""
    return float(Decimal(amount) * 10_000_000)


_WINDOWS: dict[str, tuple[str, float, float]] = {}  # the last period found of each kind


def window(period: str, now: float) -> tuple[str, float, float]:
    """The calendar period (UTC) holding `now`: its name, its start and its end (the last
    one found of its kind, while `now` lies in it: every request with a budget asks)."""
    held = _WINDOWS.get(period)
    if held is not None and held[1] <= now < held[2]:
        return held
    found = _WINDOWS[period] = _window(period, now)
    return found


def _window(period: str, now: float) -> tuple[str, float, float]:
    day = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + datetime.timedelta(days=1)
    elif period == "week":
        start = day - datetime.timedelta(days=day.weekday())
        end = start + datetime.timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + datetime.timedelta(days=32)).replace(day=1)
    return start.strftime("%Y-%m-%d"), start.timestamp(), end.timestamp()


def bucket(key_id: str, budget: Budget, now: float, cost: float = 0.0, need: float = SPAN) -> Want:
    """The key's money bucket for the period holding `now`, as a settlement asks of it (or a
    request: `cost` taken if the bucket holds `need`)."""
    name, _, end = window(budget.period, now)
    return Want(f"{{k:{key_id}}}:spend:{budget.period}:{name}", SPAN, 0.0, cost, need, kept_until(end, now))


def spend(grant: Grant, call: Call, price: Price, now: float) -> Extra:
    """The key's money bucket for this request: its reservation, refusal and settlement."""
    assert grant.budget is not None
    budget = budget_nanodollars(grant.budget)
    _, _, end = window(grant.budget.period, now)
    estimate, most = len(call.body) // 4, max_tokens(call)
    reserved = price.of(estimate, most)
    want = bucket(grant.id, grant.budget, now, reserved, SPAN - budget + 1)

    def refusal() -> LimitReached:
        error = LimitReached(f"budget: key {grant.id} has spent its budget of {grant.budget.amount} cents "  # type: ignore[union-attr]
                             f"(USD) per {grant.budget.period}; it resets at {rfc3339(end)}",  # type: ignore[union-attr]
                             retry_after=str(max(1, math.ceil(end - now))), extra={}, should_retry=False)  # fmt: skip
        error.details = {"error_code": "enforced_spend_limit_reached"}
        return error

    def settle(outcome: Outcome) -> float:
        served = outcome.status == 200
        used_in = outcome.input_tokens if outcome.input_tokens is not None else (estimate if served else 0)
        used_out = outcome.output_tokens if outcome.output_tokens is not None else (most if served else 0)
        if outcome.endpoint == "count_tokens":
            used_in = used_out = 0
        used = price.of(used_in, used_out, outcome.cache_read_tokens or 0, outcome.cache_creation_tokens or 0)
        return reserved - used

    return Extra(want, refusal, settle)
