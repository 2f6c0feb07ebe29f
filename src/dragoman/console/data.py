"""What the console's views show, as plain JSON-able dicts: one async function per view,
each given the gateway. Charts read the rollups (`UsageStore.sums` over whole buckets),
never the raw ledger; the latest requests read the ledger's newest rows by index. What a
process holds is written first, so a view includes every request finished before it.

Every number here is the usage report's: the same `UsageStore.sums`, the same buckets."""

from __future__ import annotations

import math
import time
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from dragoman.console.breakdown import CSV_COLUMNS, OTHER, usage, usage_csv
from dragoman.console.replicas import replicas
from dragoman.console.store import guarded, store_of
from dragoman.core.errors import InvalidRequest
from dragoman.usage.records import WIDTH_SECONDS, Query, Sums, UsageRecord, UsageStore
from dragoman.usage.rollups import quantile

if TYPE_CHECKING:
    from dragoman.assembly.gateway import Gateway

__all__ = ["CSV_COLUMNS", "OTHER", "me", "overview", "replicas", "requests", "usage", "usage_csv"]

# period: (bucket width, buckets shown)
PERIODS = {"hour": ("1m", 60), "day": ("1h", 24), "week": ("1h", 168)}
MAX_REQUESTS = 1000


async def _sums(gateway: Gateway, store: UsageStore, query: Query) -> list[Sums]:
    return await guarded(gateway, store.sums(query))


def _figures(sums: list[Sums]) -> dict[str, Any]:
    """The overview's figures for what `sums` add up to."""
    requests = sum(s.requests for s in sums)
    errors = sum(s.errors for s in sums)
    fresh = sum(s.input_tokens + s.cache_creation_tokens for s in sums)
    read = sum(s.cache_read_tokens for s in sums)
    histogram = [sum(column) for column in zip(*(s.ttft for s in sums if s.ttft), strict=True)]
    return {
        "requests": requests,
        "input_tokens": sum(s.input_tokens for s in sums),
        "output_tokens": sum(s.output_tokens for s in sums),
        "cache_read_tokens": read,
        "cache_creation_tokens": sum(s.cache_creation_tokens for s in sums),
        "errors": errors,
        "error_rate": errors / requests if requests else None,
        "ttft_p50": quantile(histogram, 0.5),
        "ttft_p95": quantile(histogram, 0.95),
        "cache_hit_rate": read / (read + fresh) if read + fresh else None,  # of the prompt's tokens
    }


async def overview(gateway: Gateway, period: str = "hour") -> dict[str, Any]:
    """The last hour (by the minute), day or week (by the hour), up to now, and its totals."""
    if period not in PERIODS:
        raise InvalidRequest(f"period: one of {', '.join(PERIODS)}, got {str(period)[:40]!r}")
    name, count = PERIODS[period]
    width = WIDTH_SECONDS[name]
    end = (math.floor(time.time() / width) + 1) * width  # the end of the current bucket: whole buckets only
    start = end - count * width
    store = await store_of(gateway)
    by_bucket = {s.bucket: s for s in await _sums(gateway, store, Query(start, end, width, ttft=True))}
    series = [{"t": t, **_figures([by_bucket[t]] if t in by_bucket else [])} for t in range(start, end, width)]
    return {"period": period, "bucket_width": name, "start": start, "end": end, "series": series,
            "totals": _figures(list(by_bucket.values()))}  # fmt: skip


def _key_names(gateway: Gateway) -> dict[str | None, str]:
    return {key: grant.name for key, grant in gateway.keyring.by_id.items()}


def _request_row(record: UsageRecord, names: dict[str | None, str]) -> dict[str, Any]:
    return {
        "time": record.at, "request_id": record.request_id, "endpoint": record.endpoint, "key_id": record.key_id,
        "key_name": names.get(record.key_id), "tenant": record.tenant, "model": record.model,
        "upstream": record.upstream, "replica": record.replica, "status": record.status,
        "error_type": record.error_type, "disconnected": record.disconnected, "input_tokens": record.input_tokens,
        "output_tokens": record.output_tokens, "cache_read_tokens": record.cache_read_tokens,
        "cache_creation_tokens": record.cache_creation_tokens, "duration": record.duration, "ttft": record.ttft,
    }  # fmt: skip


async def requests(gateway: Gateway, limit: int = 50, failures_first: bool = False,
                   key_id: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The latest `limit` requests, newest first (with `failures_first`, the latest failures
    first, then the latest others), optionally of one key. What was asked is never stored."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_REQUESTS:
        raise InvalidRequest(f"limit: a whole number from 1 to {MAX_REQUESTS}, got {str(limit)[:40]!r}")
    store = await store_of(gateway)
    if failures_first:
        records = await guarded(gateway, store.recent(limit, True, key_id))
        if len(records) < limit:
            records += await guarded(gateway, store.recent(limit - len(records), False, key_id))
    else:
        records = await guarded(gateway, store.recent(limit, None, key_id))
    names = _key_names(gateway)
    return {"data": [_request_row(r, names) for r in records]}


async def me(gateway: Gateway, key_id: str) -> dict[str, Any]:
    """A client key's own page: the key (limits, budget and what is left of it) and its usage
    over the last day, by the hour."""
    described = await gateway.key_admin.retrieve(key_id)
    budget = described.get("budget")
    used = remaining = None
    if budget is not None and budget.get("used") is not None:
        used = budget["used"]
        try:
            remaining = _decimal(max(Decimal(0), Decimal(budget["amount"]) - Decimal(used)))
        except InvalidOperation:
            remaining = None
    key = {name: described.get(name) for name in ("id", "name", "status", "tenant", "limits", "models", "budget",
                                                  "expires_at", "last_used_at", "partial_key_hint")}  # fmt: skip
    key.update(budget_used=used, budget_remaining=remaining)
    width = 3600
    end = (math.floor(time.time() / width) + 1) * width
    start = end - 24 * width
    store = await store_of(gateway)
    sums = await _sums(gateway, store, Query(start, end, width, key_ids=(key_id,), ttft=True))
    by_bucket = {s.bucket: s for s in sums}
    series = [{"t": t, **_figures([by_bucket[t]] if t in by_bucket else [])} for t in range(start, end, width)]
    return {"key": key, "usage": {"period": "day", "bucket_width": "1h", "start": start, "end": end,
                                  "totals": _figures(sums), "series": series}}  # fmt: skip


def _decimal(value: Decimal) -> str:
    return format(value, "f").rstrip("0").rstrip(".") if "." in format(value, "f") else format(value, "f")
