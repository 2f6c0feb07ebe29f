"""How a `Query` is answered: from the rollups (usage.rollups) for the whole minutes, hours
and days of its range, and from the records for the seconds at its edges, in one sum. Both
are written in one transaction, so the two never disagree; a query the rollups cannot
answer (grouped by what no grain keeps) reads the records alone."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dragoman.usage.records import Query, Sums, UsageRecord
from dragoman.usage.rollups import COUNTED, DIMENSIONS, GRAINS, TTFT_COLUMNS, WIDTHS, Dialect
from dragoman.usage.schema import COLUMNS, SUMMED, sums_sql

Statement = tuple[str, list[object]]
COLUMN = {"api_key_id": "key_id"}  # a group's column (the others are named as their column)
READ = {"key_id": "NULLIF(key_id, '')", "tenant": "NULLIF(tenant, '')"}  # '' in a rollup is a missing one


def grain_for(query: Query) -> str | None:
    """The narrowest rollup grain that can answer `query`; None if only the records can."""
    needed = {COLUMN.get(g, g) for g in query.group_by}
    needed |= {"key_id"} if query.key_ids else set()
    needed |= {"model"} if query.models else set()
    needed |= {"tenant"} if query.tenants else set()
    for grain, dims in GRAINS.items():
        if needed <= set(dims) and (query.refusals is None or "refused" in dims):
            return grain
    return None


def pieces(start: float, end: float, widths: tuple[int, ...]) -> list[tuple[int, float, float]]:
    """[start, end) cut into (width, from, to): whole buckets of the coarsest width that
    fits, then finer ones at the edges; width 0 for what is left (less than the finest)."""
    if start >= end:
        return []
    if not widths:
        return [(0, start, end)]
    width, finer = widths[0], widths[1:]
    first = math.ceil(start / width) * width  # (a division may round either way: set right by comparing)
    first += width if first < start else -width if first - width >= start else 0
    last = math.floor(end / width) * width
    last += -width if last > end else width if last + width <= end else 0
    if first >= last:
        return pieces(start, end, finer)
    return [*pieces(start, first, finer), (width, first, last), *pieces(last, end, finer)]


def plan(query: Query, dialect: Dialect, counters: tuple[str, ...] = COUNTED) -> list[Statement]:
    """The statements whose sums, added up (`combine`, or `combine_rows`), answer `query`:
    rows of the bucket (if bucketed), the groups, `counters`, then the TTFT histogram if asked."""
    grain = grain_for(query)
    if grain is None:
        return [sums_sql(query, dialect, counters)]
    widths = tuple(w for w in WIDTHS if not query.width or query.width % w == 0)
    return [
        sums_sql(dataclasses.replace(query, start=a, end=b), dialect, counters) if width == 0
        else _rollup_sql(query, grain, width, int(a), int(b), dialect, counters)
        for width, a, b in pieces(query.start, query.end, widths)
    ]  # fmt: skip


def _rollup_sql(query: Query, grain: str, width: int, start: int, end: int, dialect: Dialect,
                counters: tuple[str, ...]) -> Statement:  # fmt: skip
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return "?" if dialect == "sqlite" else f"${len(args)}"

    grouped = [COLUMN.get(g, g) for g in query.group_by]  # by the stored columns: in the key's order, no sort
    columns = [READ.get(c, c) for c in grouped]
    if query.width:  # a rollup's bucket lies inside one of the query's (its width divides theirs)
        bucket = "bucket" if query.width == width else f"(bucket / {int(query.width)}) * {int(query.width)}"
        columns.insert(0, bucket)
        grouped.insert(0, bucket)
    where = [f"grain = '{grain}'", f"width = {width}", f"bucket >= {arg(start)}", f"bucket < {arg(end)}"]
    for column, values in (("key_id", query.key_ids), ("model", query.models), ("tenant", query.tenants)):
        if values:
            where.append(f"{column} IN ({', '.join(arg(v) for v in values)})")
    if query.refusals is not None:
        where.append(f"refused = {int(query.refusals)}")
    if query.group_by:  # and by the dimensions before them the grain leaves blank (the same groups): in the
        named = grouped[len(grouped) - len(query.group_by) :]  # key's order, so read without a sort
        last = max(DIMENSIONS.index(d) for d in named)
        grouped[len(grouped) - len(named) :] = [
            d for d in DIMENSIONS[: last + 1] if d in named or d not in GRAINS[grain]
        ]
    sums = ", ".join(f"CAST(sum({c}) AS BIGINT)" for c in (*counters, *(TTFT_COLUMNS if query.ttft else ())))
    sql = (f"SELECT {', '.join([*columns, sums])} FROM usage_rollups WHERE {' AND '.join(where)}"
           + (f" GROUP BY {', '.join(grouped)}" if grouped else ""))  # fmt: skip
    return sql, args


def combine(parts: list[list[Sums]]) -> list[Sums]:
    """The pieces' sums added up by bucket and groups; in order of bucket, then groups (a
    missing one first, then by code point: the same from both databases, whatever their collation)."""
    held: dict[tuple[float, tuple[str | None, ...]], Sums] = {}
    for sums in (s for part in parts for s in part):
        key = (sums.bucket, sums.groups)
        seen = held.get(key)
        held[key] = sums if seen is None else _add(seen, sums)
    return [held[key] for key in sorted(held, key=lambda k: (k[0], [(g is not None, g or "") for g in k[1]]))]


def combine_rows(parts: list[list[tuple[Any, ...]]], keys: int, bucketed: bool) -> list[tuple[Any, ...]]:
    """`combine` for plain rows (`keys` columns of bucket and groups, then counters, the
    request count first): rows over no requests left out, none made per row but the added."""
    held: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in (row for part in parts for row in part):
        if not row[keys]:
            continue
        key = row[:keys]
        seen = held.get(key)
        held[key] = row if seen is None else (*key, *(a + b for a, b in zip(seen[keys:], row[keys:], strict=True)))
    if bucketed and keys == 2:  # a bucket and one group: a chart's
        return sorted(held.values(), key=lambda r: (r[0], r[1] is not None, r[1] or ""))
    return sorted(held.values(), key=lambda r: [(g is not None, "" if g is None else g) for g in r[:keys]])


def _add(a: Sums, b: Sums) -> Sums:
    fields = {name: getattr(a, name) + getattr(b, name) for name in ("requests", "errors", *SUMMED)}
    none = (0,) * len(TTFT_COLUMNS)
    ttft = tuple(x + y for x, y in zip(a.ttft or none, b.ttft or none, strict=True)) if a.ttft or b.ttft else ()
    return dataclasses.replace(a, ttft=ttft, **fields)


def recent_sql(dialect: Dialect, limit: int, failures: bool | None, key_id: str | None) -> Statement:
    """The latest records, newest first (on the `at`, `(key_id, at)` and failures' indexes)."""
    args: list[object] = []
    mark = (lambda: "?") if dialect == "sqlite" else (lambda: f"${len(args)}")
    where = []
    if key_id is not None:
        args.append(key_id)
        where.append(f"key_id = {mark()}")
    if failures is not None:
        where.append(f"error_type IS {'NOT ' if failures else ''}NULL")
    args.append(int(limit))
    at = "at" if dialect == "sqlite" else "extract(epoch from at)::float8"
    names = ", ".join(at if c == "at" else c for c in COLUMNS)
    return (f"SELECT {names} FROM usage_records" + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY at DESC LIMIT {mark()}", args)  # fmt: skip


def records_of(rows: list[tuple[object, ...]]) -> list[UsageRecord]:
    return [UsageRecord(*row[:14], bool(row[14]), *row[15:]) for row in rows]  # type: ignore[arg-type,call-arg]
