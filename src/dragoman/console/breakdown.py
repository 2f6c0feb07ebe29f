"""The console's usage view: usage over a chosen period in buckets, by key, tenant or model,
as stacked series, and the same rows as CSV. The numbers are the usage report's (the same
`UsageStore.sums`, buckets snapped to their UTC start).

A chart shows the `top` groups by tokens (input, output and cache reads), and one more,
`OTHER`, for the rest together (requests without a key among them, if there are more groups
than `top`): per bucket, every group's sums add up to the period's."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import time
from typing import TYPE_CHECKING, Any

from dragoman.console.store import guarded, store_of
from dragoman.core.errors import InvalidRequest
from dragoman.usage.records import WIDTH_SECONDS, Query, Sums

if TYPE_CHECKING:
    from dragoman.assembly.gateway import Gateway

GROUP_BY = {"key": "api_key_id", "tenant": "tenant", "model": "model"}
MAX_BUCKETS = 1500  # of a chart (a day by the minute from any second, four years by the day)
MAX_TOP = 100
OTHER = "(other)"
FIELDS = ("requests", "input_tokens", "output_tokens", "cache_read_tokens")
CSV_COLUMNS = ("t", "time", "group", "name", *FIELDS)


def usage_query(start: float, end: float, bucket: str, group_by: str, top: int = 20) -> Query:
    """The store's query for the view's arguments, each checked (an error names it)."""
    if bucket not in WIDTH_SECONDS:
        raise InvalidRequest(f"bucket: one of {', '.join(WIDTH_SECONDS)}, got {str(bucket)[:40]!r}")
    if group_by not in GROUP_BY:
        raise InvalidRequest(f"group_by: one of {', '.join(GROUP_BY)}, got {str(group_by)[:40]!r}")
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise InvalidRequest(f"top: a whole number from 1 to {MAX_TOP}, got {str(top)[:40]!r}")
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise InvalidRequest(f"{name}: a time in seconds since the epoch, got {str(value)[:40]!r}")
    width = WIDTH_SECONDS[bucket]
    first = math.floor(start / width) * width  # buckets snap to their UTC start, as the usage report's
    if end <= first:
        raise InvalidRequest("start: must be before end")
    if math.ceil((end - first) / width) > MAX_BUCKETS:
        raise InvalidRequest(f"bucket: {bucket} buckets from start to end are more than {MAX_BUCKETS}; "
                             "choose a wider bucket or a shorter period")  # fmt: skip
    return Query(first, end, width, (GROUP_BY[group_by],))


async def _chosen(gateway: Gateway, query: Query, group_by: str, top: int) -> list[tuple[Any, ...]]:
    """The query's rows (bucket, group, *FIELDS): every group's if there are `top` or fewer,
    else the `top` largest groups' and OTHER's (the whole less theirs). Three reads of rollups
    at most; never one row per bucket for every one of hundreds of keys. Plain rows, no
    object per row: a day by the minute is thousands."""
    store = await store_of(gateway)
    totals = await guarded(gateway, store.sums(dataclasses.replace(query, width=0)))
    if len(totals) <= top:
        return await guarded(gateway, store.rows(query, FIELDS))
    ranked = sorted(totals, key=lambda s: (-_tokens(s), -s.requests, str(s.groups[0])))
    chosen = tuple(g for g in (s.groups[0] for s in ranked) if g is not None)[:top]
    only = {"key": Query(query.start, query.end, query.width, query.group_by, key_ids=chosen),
            "tenant": Query(query.start, query.end, query.width, query.group_by, tenants=chosen),
            "model": Query(query.start, query.end, query.width, query.group_by, models=chosen)}[group_by]  # fmt: skip
    rows = await guarded(gateway, store.rows(only, FIELDS))
    whole = await guarded(gateway, store.rows(dataclasses.replace(query, group_by=()), FIELDS))
    shown: dict[int, list[int]] = {}
    for bucket, _, *values in rows:
        held = shown.get(bucket)
        if held is None:
            shown[bucket] = values
        else:
            held[:] = [a + b for a, b in zip(held, values, strict=True)]
    none = [0] * len(FIELDS)
    for bucket, *values in whole:
        rest = [w - v for w, v in zip(values, shown.get(bucket, none), strict=True)]
        if any(rest):
            rows.append((bucket, OTHER, *rest))
    return sorted(rows, key=lambda r: r[0])


def _tokens(s: Sums) -> int:
    return s.input_tokens + s.output_tokens + s.cache_read_tokens


async def usage(gateway: Gateway, start: float, end: float, bucket: str = "1h", group_by: str = "key",
                top: int = 20) -> dict[str, Any]:  # fmt: skip
    """Usage between `start` and `end` in `bucket`s, by key, tenant or model. Only buckets
    and groups with requests are in `series`; `buckets` lists every bucket's start, and
    `groups` each group shown with its totals, largest first."""
    query = usage_query(start, end, bucket, group_by, top)
    names: dict[str | None, str | None] = {OTHER: "every other"}
    if group_by == "key":
        names.update((key, grant.name) for key, grant in gateway.keyring.by_id.items())
    totals: dict[str | None, list[int]] = {}
    shown: dict[str | None, str | None] = {}  # each group's name
    series = []
    for t, group, requests, input_tokens, output_tokens, cache_read in await _chosen(gateway, query, group_by, top):
        held = totals.get(group)
        if held is None:
            held = totals[group] = [0, 0, 0, 0]
            shown[group] = names.get(group) if group_by == "key" or group == OTHER else group
        series.append({"t": int(t), "group": group, "name": shown[group], "requests": requests,
                       "input_tokens": input_tokens, "output_tokens": output_tokens,
                       "cache_read_tokens": cache_read})  # fmt: skip
        held[0] += requests
        held[1] += input_tokens
        held[2] += output_tokens
        held[3] += cache_read
    order = sorted(totals, key=lambda g: (g == OTHER, -(totals[g][1] + totals[g][2] + totals[g][3]), -totals[g][0]))
    groups = [{"group": g, "name": shown[g], "other": g == OTHER,
               **dict(zip(FIELDS, totals[g], strict=True))} for g in order]  # fmt: skip
    width = int(query.width)
    return {"bucket_width": bucket, "group_by": group_by, "start": int(query.start), "end": end,
            "buckets": list(range(int(query.start), math.ceil(end / width) * width, width)),
            "groups": groups, "series": series}  # fmt: skip


async def usage_csv(gateway: Gateway, start: float, end: float, bucket: str = "1h", group_by: str = "key",
                    top: int = 20) -> str:  # fmt: skip
    """`usage`'s series as CSV, a header line first; `time` is the bucket's start in RFC 3339."""
    shown = await usage(gateway, start, end, bucket, group_by, top)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in shown["series"]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["t"]))
        writer.writerow([row["t"], stamp, _cell(row["group"]), _cell(row["name"]), *(row[f] for f in FIELDS)])
    return out.getvalue()


def _cell(value: str | None) -> str:
    """A name as a CSV cell, never a formula a spreadsheet would run (names are chosen by people)."""
    text = "" if value is None else value
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
