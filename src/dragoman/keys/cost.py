"""Anthropic's cost report, `GET /v1/organizations/cost_report`, from the usage records and
`[[models]] price`: daily buckets (UTC), amounts in cents as decimal strings.

`group_by[]`: `workspace_id` is the tenant; `description` splits by model and token type
(Anthropic's `model`, `token_type`, `cost_type` fields); dragoman adds `api_key_id`.
A model without a price costs 0."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dragoman.core.errors import InvalidRequest
from dragoman.keys.money import Price, Prices, cents, window
from dragoman.keys.records import Budget
from dragoman.usage.records import Query, Sums, UsageStore
from dragoman.usage.report import _cursor, _many, _one, _page_start, _rfc3339, _timestamp

DAY = 86400
GROUPS = ("workspace_id", "description", "api_key_id")
TOKEN_TYPES = (  # (token_type, its words in a description, the Sums field, the Price field)
    ("uncached_input_tokens", "Input Tokens", "input_tokens", "input"),
    ("output_tokens", "Output Tokens", "output_tokens", "output"),
    ("cache_read_input_tokens", "Cache Read Tokens", "cache_read_tokens", "cache_read"),
    ("cache_creation.ephemeral_5m_input_tokens", "Cache Write Tokens", "cache_creation_tokens", "cache_write"),
)
FREE = Price(0.0, 0.0, 0.0, 0.0)


class CostQuery:
    def __init__(self, params: Mapping[str, Sequence[str]], now: float | None = None) -> None:
        width = _one(params, "bucket_width") or "1d"
        if width != "1d":
            raise InvalidRequest(f"bucket_width: the cost report has daily buckets only (1d), got {width!r}")
        starting_at = _one(params, "starting_at")
        if starting_at is None:
            raise InvalidRequest("starting_at: required (an RFC 3339 timestamp)")
        start = math.floor(_timestamp("starting_at", starting_at) / DAY) * DAY
        ending_at = _one(params, "ending_at")
        self.end = _timestamp("ending_at", ending_at) if ending_at else (time.time() if now is None else now)
        if self.end <= start:
            raise InvalidRequest("starting_at: must be before ending_at (default: now)")
        page = _one(params, "page")
        self.start = _page_start("page", page, start, self.end, DAY) if page else start
        limit = _one(params, "limit")
        try:
            self.limit = 7 if limit is None else int(limit)
        except ValueError:
            raise InvalidRequest(f"limit: must be a whole number, got {limit!r}") from None
        if not 1 <= self.limit <= 31:
            raise InvalidRequest(f"limit: must be 1 to 31, got {self.limit}")
        self.group_by = tuple(dict.fromkeys(_many(params, "group_by")))
        for group in self.group_by:
            if group not in GROUPS:
                raise InvalidRequest(f"group_by: unknown value {group!r} (one of {', '.join(GROUPS)})")

    def page_end(self) -> float:
        return min(self.start + self.limit * DAY, math.ceil(self.end / DAY) * DAY)


async def cost_report(store: UsageStore, prices: Prices, query: CostQuery) -> dict[str, Any]:
    columns = ("model", "upstream_model") + tuple({"workspace_id": "tenant", "api_key_id": "api_key_id"}[g]
                                                  for g in query.group_by if g != "description")  # fmt: skip
    sums = await store.sums(Query(query.start, min(query.page_end(), query.end), DAY, columns))
    buckets: dict[float, dict[tuple[Any, ...], float]] = {}
    for row in sums:
        groups = dict(zip(columns, row.groups, strict=True))
        price = prices.get(groups["model"] or "", groups["upstream_model"] or "") or FREE  # as budgets price it
        for token_type, _, field, price_field in TOKEN_TYPES:
            amount = getattr(row, field) * getattr(price, price_field)
            key = (groups.get("tenant"), groups.get("api_key_id"),
                   (groups["model"], token_type) if "description" in query.group_by else None)  # fmt: skip
            bucket = buckets.setdefault(row.bucket, {})
            bucket[key] = bucket.get(key, 0.0) + amount
    data, at = [], query.start
    while at < query.page_end():
        results = [_result(key, amount, query.group_by) for key, amount in sorted(buckets.get(at, {}).items(), key=str)]
        data.append({"starting_at": _rfc3339(at), "ending_at": _rfc3339(at + DAY), "results": results})
        at += DAY
    more = at < query.end
    return {"data": data, "has_more": more, "next_page": _cursor(at) if more else None}


def _result(key: tuple[Any, ...], amount: float, group_by: tuple[str, ...]) -> dict[str, Any]:
    tenant, api_key, described = key
    model, token_type = described or (None, None)
    words = next((w for t, w, _, _ in TOKEN_TYPES if t == token_type), "")
    result = {
        "currency": "USD", "amount": cents(amount), "workspace_id": tenant,
        "description": f"{model} Usage - {words}" if described else None,
        "cost_type": "tokens" if described else None, "context_window": None, "model": model,
        "service_tier": "standard" if described else None, "token_type": token_type, "inference_geo": None,
    }  # fmt: skip
    if "api_key_id" in group_by:
        result["api_key_id"] = api_key
    return result


async def spent(store: UsageStore, prices: Prices, key_id: str, budget: Budget, now: float | None = None) -> float:
    """What a key's recorded requests cost in its budget's current period, in nano-dollars."""
    now = time.time() if now is None else now
    _, start, _ = window(budget.period, now)
    return (await spent_by_key(store, prices, (key_id,), start, now + 1))[key_id]


async def spent_by_key(store: UsageStore, prices: Prices, key_ids: Sequence[str], start: float,
                       end: float) -> dict[str, float]:  # fmt: skip
    """What each key's requests that began between `start` and `end` cost, in nano-dollars,
    priced as a budget's settlement prices them (the name asked for, else the one served).
    No `key_ids`: every key's."""
    query = Query(start, end, 0, ("api_key_id", "model", "upstream_model"), key_ids=tuple(key_ids))
    totals = dict.fromkeys(key_ids, 0.0)
    for row in await store.sums(query):
        key, model, upstream = row.groups
        if key is not None and (key in totals or not key_ids):
            totals[key] = totals.get(key, 0.0) + _cost(row, prices.get(model or "", upstream or "") or FREE)
    return totals


def _cost(row: Sums, price: Price) -> float:
    return price.of(row.input_tokens, row.output_tokens, row.cache_read_tokens, row.cache_creation_tokens)
