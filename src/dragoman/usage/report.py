"""Anthropic's Admin API usage report, `GET /v1/organizations/usage_report/messages`,
over the stored records: the same query parameters, buckets, pagination and shape.

Time buckets snap to the start of their UTC minute, hour or day; every bucket of the
range is listed, an idle one with no results. `limit` counts buckets, as Anthropic's
does, and `next_page` is an opaque cursor naming the next bucket."""

from __future__ import annotations

import base64
import binascii
import datetime
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dragoman.core.errors import InvalidRequest
from dragoman.usage.records import WIDTH_SECONDS, Query, Sums, UsageStore

# bucket_width: (default limit, most allowed), as Anthropic's.
LIMITS = {"1d": (7, 31), "1h": (24, 168), "1m": (60, 1440)}
GROUPED = {"api_key_id", "model"}  # what dragoman records; Anthropic's other dimensions answer null
ANTHROPIC_GROUPS = GROUPED | {"workspace_id", "service_tier", "context_window", "inference_geo", "speed",
                              "account_id", "service_account_id"}  # fmt: skip
PAGE_PREFIX = "page_"
# The times a report can name: each bucket's start and end must be a time `datetime` can write
# (years 1 to 9999), the end of a day bucket begun on the last allowed day included.
EARLIEST = datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)
LATEST = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)
_RANGE = "from 0001-01-01T00:00:00Z to 9999-12-31T00:00:00Z"


class ReportQuery:
    """The request's parameters, checked: each error names its parameter."""

    def __init__(self, params: Mapping[str, Sequence[str]], now: float | None = None) -> None:
        width = _one(params, "bucket_width") or "1d"
        if width not in LIMITS:
            raise InvalidRequest(f"bucket_width: must be one of 1d, 1h, 1m, got {width!r}")
        self.width_name, self.width = width, WIDTH_SECONDS[width]
        starting_at = _one(params, "starting_at")
        if starting_at is None:
            raise InvalidRequest("starting_at: required (an RFC 3339 timestamp)")
        start = self._snap(_timestamp("starting_at", starting_at))
        ending_at = _one(params, "ending_at")
        self.end = (
            _timestamp("ending_at", ending_at) if ending_at is not None else (time.time() if now is None else now)
        )
        if self.end <= start:
            raise InvalidRequest("starting_at: must be before ending_at (default: now)")
        page = _one(params, "page")
        self.start = _page_start("page", page, start, self.end, self.width) if page else start
        default, most = LIMITS[width]
        limit = _one(params, "limit")
        try:
            self.limit = default if limit is None else int(limit)
        except ValueError:
            raise InvalidRequest(f"limit: must be a whole number, got {limit!r}") from None
        if not 1 <= self.limit <= most:
            raise InvalidRequest(f"limit: must be 1 to {most} for bucket_width {width}, got {self.limit}")
        self.group_by = tuple(dict.fromkeys(_many(params, "group_by")))
        unknown = [g for g in self.group_by if g not in ANTHROPIC_GROUPS]
        if unknown:
            raise InvalidRequest(f"group_by: unknown value {unknown[0]!r} (dragoman groups by api_key_id and model)")
        self.key_ids = tuple(_many(params, "api_key_ids"))
        self.models = tuple(_many(params, "models"))

    def _snap(self, at: float) -> float:
        return math.floor(at / self.width) * self.width

    def page_end(self) -> float:
        """The end of this page's last bucket (or of the range, if sooner)."""
        return min(self.start + self.limit * self.width, math.ceil(self.end / self.width) * self.width)

    def store_query(self) -> Query:
        groups = tuple(g for g in self.group_by if g in GROUPED)
        return Query(self.start, min(self.page_end(), self.end), self.width, groups, self.key_ids, self.models)


async def report(store: UsageStore, query: ReportQuery) -> dict[str, Any]:
    """The report's page for `query`."""
    stored = query.store_query()
    by_bucket: dict[float, list[Sums]] = {}
    for sums in await store.sums(stored):
        by_bucket.setdefault(sums.bucket, []).append(sums)
    data = []
    bucket, page_end = query.start, query.page_end()
    while bucket < page_end:
        results = [_result(s, stored.group_by, query.group_by) for s in by_bucket.get(bucket, [])]
        data.append({"starting_at": _rfc3339(bucket), "ending_at": _rfc3339(bucket + query.width), "results": results})
        bucket += query.width
    more = bucket < query.end
    return {"data": data, "has_more": more, "next_page": _cursor(bucket) if more else None}


def _result(sums: Sums, grouped: tuple[str, ...], asked: tuple[str, ...]) -> dict[str, Any]:
    values = dict(zip(grouped, sums.groups, strict=True))
    result: dict[str, Any] = {
        "uncached_input_tokens": sums.input_tokens,
        "cache_creation": {
            "ephemeral_1h_input_tokens": sums.cache_creation_1h_tokens,
            # Anthropic's default lifetime: also where writes go whose upstream told no breakdown
            "ephemeral_5m_input_tokens": max(0, sums.cache_creation_tokens - sums.cache_creation_1h_tokens),
        },
        "cache_read_input_tokens": sums.cache_read_tokens,
        "output_tokens": sums.output_tokens,
        "server_tool_use": {"web_search_requests": sums.web_search_requests},
    }
    for name in ("api_key_id", "workspace_id", "model", "service_tier", "context_window", "inference_geo"):
        result[name] = values.get(name)
    for name in asked:
        result.setdefault(name, None)
    return result


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = params.get(name) or []
    if len(values) > 1:
        raise InvalidRequest(f"{name}: given {len(values)} times; give it once")
    return values[0] if values else None


def _many(params: Mapping[str, Sequence[str]], name: str) -> list[str]:
    """An array parameter, as the SDKs send it (`name[]=a&name[]=b`) or repeated plainly."""
    return [*(params.get(f"{name}[]") or []), *(params.get(name) or [])]


def _timestamp(name: str, value: str) -> float:
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name}: not an RFC 3339 timestamp: {value[:40]!r}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    if not EARLIEST <= at <= LATEST:  # year 1 east of UTC is year 0 in UTC, which `datetime` cannot hold
        raise InvalidRequest(f"{name}: {value[:40]!r} is out of range; a time {_RANGE} is accepted")
    return at.timestamp()


def _rfc3339(at: float) -> str:
    """`at` as RFC 3339 in UTC, its year in four digits (`%Y` writes year 1 as "1")."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def _cursor(at: float) -> str:
    return PAGE_PREFIX + base64.urlsafe_b64encode(_rfc3339(at).encode()).decode()


def _page_start(name: str, page: str, start: float, end: float, width: int) -> float:
    """The bucket a cursor names: within the range and on a bucket boundary, or a 400."""
    try:
        text = base64.urlsafe_b64decode(page.removeprefix(PAGE_PREFIX).encode()).decode()
        at = datetime.datetime.fromisoformat(text).timestamp()
    except (ValueError, binascii.Error):
        raise InvalidRequest(f"{name}: not a cursor from this report's next_page") from None
    if not start <= at < end or (at - start) % width:
        raise InvalidRequest(f"{name}: the cursor is for another range or bucket_width")
    return at
