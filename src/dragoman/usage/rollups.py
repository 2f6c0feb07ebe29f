"""Rollups: sums of the usage records per minute, hour and day, kept by the writer in the
transaction that stores the records, so that reading a week costs a few hundred rows.

Grains, each a set of dimensions (the others are '' or 0 in its rows): `all` (none: the
console's overview); `key`, `tenant` and `model` (each with whether the key was refused: a
chart by one of them); `full` (key, tenant, model, upstream model, refused: any other
grouping or filter of `Query`'s, as the usage report's); `replica` (upstream and replica). A record is counted once: only records the insert actually added
(not those whose request id was stored already) are rolled up. A missing key id or tenant
is '' here (a NULL could not take part in the primary key) and NULL again when read.

Time to first token is kept as a histogram of fixed, log-spaced buckets (`TTFT_BOUNDS`), so
a bucket's p50 or p95 comes from its rollup rows alone (`quantile`)."""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable
from typing import Literal

from dragoman.usage.records import UsageRecord

Dialect = Literal["sqlite", "postgres"]

# Upper bounds (seconds) of the TTFT buckets, a factor of sqrt(2) apart, 10 ms to 82 s; one
# more bucket holds what is slower. Fixed: stored rows count by these positions.
TTFT_BOUNDS: tuple[float, ...] = tuple(round(0.01 * 2 ** (i / 2), 4) for i in range(27))
TTFT_COLUMNS = tuple(f"ttft_{i}" for i in range(len(TTFT_BOUNDS) + 1))
WIDTHS = (86400, 3600, 60)  # coarsest first: a range is read from the coarsest rollups that fit
DIMENSIONS = ("key_id", "tenant", "model", "upstream_model", "refused", "upstream", "replica")
# Narrow grains first: a query reads the first that keeps every dimension it groups or filters
# by (a week by key is 168 x keys rows, not 168 x keys x models).
GRAINS: dict[str, tuple[str, ...]] = {
    "all": (),
    "key": ("key_id", "refused"),
    "tenant": ("tenant", "refused"),
    "model": ("model", "refused"),
    "full": ("key_id", "tenant", "model", "upstream_model", "refused"),
    "replica": ("upstream", "replica"),
}
COUNTED = ("requests", "errors", "input_tokens", "cache_read_tokens", "output_tokens", "cache_creation_tokens",
           "cache_creation_1h_tokens", "web_search_requests", "web_fetch_requests")  # fmt: skip
VALUES = (*COUNTED, *TTFT_COLUMNS)  # every counter of a row, in this order
PRIMARY = ("grain", "width", "bucket", *DIMENSIONS)
REFUSALS = (401, 403)
PG_EPOCH = 946684800  # 2000-01-01, where PostgreSQL counts its microseconds from


def ttft_bucket(ttft: float) -> int:
    return bisect.bisect_right(TTFT_BOUNDS, ttft)


def quantile(histogram: Iterable[int], q: float) -> float | None:
    """The `q` quantile (0 to 1) of a TTFT histogram, in seconds, interpolated within its
    bucket on a log scale (linearly in the first); None if it counts nothing."""
    counts = list(histogram)
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(TTFT_BOUNDS):
                return TTFT_BOUNDS[-1]  # slower than the last bound: only that much is known
            upper, share = TTFT_BOUNDS[index], (rank - seen) / count
            if index == 0:
                return upper * share
            lower = TTFT_BOUNDS[index - 1]
            return lower * (upper / lower) ** share
        seen += count
    return TTFT_BOUNDS[-1]


def bucket_of(at: float, width: int, dialect: Dialect) -> int:
    """The start of the `width` bucket holding a record that started at `at`, as the
    database will see its time: SQLite keeps the float, PostgreSQL whole microseconds."""
    if dialect == "sqlite":  # the bucket `at >= start AND at < end` puts it in, however the division rounds
        bucket = math.floor(at / width) * width
        return bucket - width if bucket > at else bucket + width if bucket + width <= at else bucket
    micros = round((at - PG_EPOCH) * 1_000_000) + PG_EPOCH * 1_000_000
    return micros // (width * 1_000_000) * width


def deltas(records: Iterable[UsageRecord], dialect: Dialect) -> list[tuple[object, ...]]:
    """The rollup rows (PRIMARY then VALUES) the records add, one per row touched, sorted
    (processes updating the same rows take their locks in one order)."""
    return spread(by_minute(records, dialect))


Sums = dict[tuple[int, tuple[object, ...]], list[int]]


Rows = dict[tuple[object, ...], list[int]]  # rollup rows by their PRIMARY key


def spread(sums: Sums) -> list[tuple[object, ...]]:
    """`by_minute`'s sums as rollup rows (see `deltas`). Records are summed per minute and
    dimensions first, then each sum spread over the grains and widths: a batch's records
    mostly share their dimensions, so the spreading runs a few times, not per record."""
    rows: Rows = {}
    spread_into(rows, sums.items())
    return [(*key, *rows[key]) for key in ordered(rows)]


_KEPT = [(grain, tuple(d in dims for d in DIMENSIONS)) for grain, dims in GRAINS.items()]
_EMPTY = tuple(0 if d == "refused" else "" for d in DIMENSIONS)


def spread_into(rows: Rows, sums: Iterable[tuple[tuple[int, tuple[object, ...]], list[int]]]) -> None:
    """Some of `by_minute`'s sums (its items) added to `rows` (a large batch spread a part at a time)."""
    for (minute, values), counts in sums:
        dims = [tuple(v if keep else e for v, keep, e in zip(values, mask, _EMPTY, strict=True)) for _, mask in _KEPT]
        for width in WIDTHS:
            bucket = minute // width * width  # a minute's start lies in one hour and one day: theirs
            for (grain, _), dim in zip(_KEPT, dims, strict=True):
                key = (grain, width, bucket, *dim)
                held = rows.get(key)
                # a sum's own list is shared by the rows it starts (never changed: adding makes a new list)
                rows[key] = counts if held is None else list(map(operator.add, held, counts))


def ordered(rows: Rows | list[tuple[str, tuple[object, ...]]]) -> list[tuple[object, ...]]:
    """The rows' keys in the one order every process takes their locks in (by their text);
    given as (text, key) pairs, sorted by those."""
    if isinstance(rows, dict):
        return [key for _, key in sorted((str(key), key) for key in rows)]
    return [key for _, key in sorted(rows)]


def by_minute(records: Iterable[UsageRecord], dialect: Dialect, sums: Sums | None = None) -> Sums:
    """The records' counters (VALUES) summed per minute bucket and dimension values, added
    to `sums` if given (a large batch summed a part at a time)."""
    sums = {} if sums is None else sums
    hist = len(COUNTED)
    for r in records:
        values = (r.key_id or "", r.tenant or "", r.model, r.upstream_model, int(r.status in REFUSALS), r.upstream,
                  r.replica)  # fmt: skip
        key = (bucket_of(r.at, 60, dialect), values)
        held = sums.get(key)
        if held is None:
            held = sums[key] = [0] * len(VALUES)
        held[0] += 1  # COUNTED, in its order
        held[1] += r.error_type is not None
        held[2] += r.input_tokens
        held[3] += r.cache_read_tokens
        held[4] += r.output_tokens
        held[5] += r.cache_creation_tokens
        held[6] += r.cache_creation_1h_tokens
        held[7] += r.web_search_requests
        held[8] += r.web_fetch_requests
        if r.ttft is not None:
            held[hist + ttft_bucket(r.ttft)] += 1
    return sums


def upsert_sql(dialect: Dialect) -> str:
    """Add rows' counts to what is stored (or store them): one row's in SQLite (executemany);
    in PostgreSQL every row's at once (one statement, one round trip)."""
    names = ", ".join((*PRIMARY, *VALUES))
    added = ", ".join(f"{v} = usage_rollups.{v} + excluded.{v}" for v in VALUES)
    conflict = f"ON CONFLICT ({', '.join(PRIMARY)}) DO UPDATE SET {added}"
    if dialect == "sqlite":
        return (
            f"INSERT INTO usage_rollups ({names}) VALUES ({', '.join('?' * (len(PRIMARY) + len(VALUES)))}) {conflict}"
        )
    # PostgreSQL: the rows as one JSON array of arrays ($1, bytes), taken apart by the server:
    # asyncpg's encoding of one array per column cost several ms a flush on the event loop.
    types = {"grain": "text", "width": "int4", "bucket": "int8", "refused": "int4"}
    fields = ", ".join(f"(r->>{i})::{types.get(c, 'text' if c in DIMENSIONS else 'int8')}"
                       for i, c in enumerate((*PRIMARY, *VALUES)))  # fmt: skip
    rows = "jsonb_array_elements(convert_from($1::bytea, 'UTF8')::jsonb) AS r"
    return f"INSERT INTO usage_rollups ({names}) SELECT {fields} FROM {rows} {conflict}"


def ttft_sums(column: str = "ttft") -> list[str]:
    """One sum per TTFT bucket over raw records."""
    bounds = ["", *(f"{column} >= {b!r}" for b in TTFT_BOUNDS)]
    uppers = [*(f"{column} < {b!r}" for b in TTFT_BOUNDS), ""]
    return [f"CAST(sum(CASE WHEN {' AND '.join(c for c in (lo, hi) if c)} THEN 1 ELSE 0 END) AS BIGINT)"
            for lo, hi in zip(bounds, uppers, strict=True)]  # fmt: skip


def create_statements(dialect: Dialect) -> list[str]:
    """The rollup table, and its rows for the records stored before it existed."""
    big = "INTEGER" if dialect == "sqlite" else "BIGINT"
    dims = ", ".join(f"{d} {'INTEGER' if d == 'refused' else 'TEXT'} NOT NULL" for d in DIMENSIONS)
    counters = ", ".join(f"{v} {big} NOT NULL" for v in VALUES)
    table = (f"CREATE TABLE usage_rollups (grain TEXT NOT NULL, width INTEGER NOT NULL, bucket {big} NOT NULL, "
             f"{dims}, {counters}, PRIMARY KEY ({', '.join(PRIMARY)}))")  # fmt: skip
    if dialect == "sqlite":  # rows kept in the key's order: a chart's range is read from adjacent pages
        table += " WITHOUT ROWID"
    return [table, *(_backfill(grain, width, dialect) for grain in GRAINS for width in WIDTHS)]


def _backfill(grain: str, width: int, dialect: Dialect) -> str:
    epoch = "at" if dialect == "sqlite" else "extract(epoch from at)"
    bucket = (f"(CAST({epoch} / {width} AS INTEGER) * {width})" if dialect == "sqlite"
              else f"CAST(floor({epoch} / {width}) * {width} AS BIGINT)")  # fmt: skip
    source = {"key_id": "coalesce(key_id, '')", "tenant": "coalesce(tenant, '')", "model": "model",
              "upstream_model": "upstream_model", "upstream": "upstream", "replica": "replica",
              "refused": f"CASE WHEN status IN ({', '.join(map(str, REFUSALS))}) THEN 1 ELSE 0 END"}  # fmt: skip
    dims = [source[d] if d in GRAINS[grain] else ("0" if d == "refused" else "''") for d in DIMENSIONS]
    sums = ["count(*)", "CAST(sum(CASE WHEN error_type IS NULL THEN 0 ELSE 1 END) AS BIGINT)",
            *(f"CAST(sum({c}) AS BIGINT)" for c in COUNTED[2:]), *ttft_sums()]  # fmt: skip
    grouped = ", ".join(str(i) for i in range(3, 3 + len(DIMENSIONS) + 1))
    return (f"INSERT INTO usage_rollups ({', '.join((*PRIMARY, *VALUES))}) "
            f"SELECT '{grain}', {width}, {bucket}, {', '.join(dims)}, {', '.join(sums)} FROM usage_records "
            f"GROUP BY {grouped}")  # fmt: skip
