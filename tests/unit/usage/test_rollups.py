"""Rollups on real SQLite and real PostgreSQL: every query answers what the records alone
answer (whole buckets from the rollups, the edges from the records); a record written twice
counts once; a database of before the rollups gets them for its records; pruning keeps the
hour and day rollups; the usage report reads the same numbers either way."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from msgspec.structs import astuple, replace

from dragoman.usage import reading
from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import Query, Sums, UsageRecord
from dragoman.usage.report import ReportQuery, report
from dragoman.usage.rollups import TTFT_BOUNDS, TTFT_COLUMNS, quantile, ttft_bucket
from dragoman.usage.schema import sums_of, sums_sql
from dragoman.usage.sqlite import SqliteStore
from tests.support.postgres import schema_url
from tests.support.usage import usage_record

BASE = 1_700_000_000.0  # a Tuesday, 22:13:20 UTC: not on any bucket's edge
Store = SqliteStore | PostgresStore


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path)
    else:
        with schema_url() as url:
            yield lambda: PostgresStore(url)


def _records(count: int, seed: int = 1) -> list[UsageRecord]:
    rnd = random.Random(seed)
    records = []
    for i in range(count):
        status = rnd.choice([200, 200, 200, 401, 429, 500])
        records.append(replace(
            usage_record(f"req_{seed}_{i}", BASE + rnd.random() * 3 * 86400),
            key_id=rnd.choice([None, "key_a", "key_b"]), tenant=rnd.choice([None, "team"]),
            model=rnd.choice(["m1", "m2"]), upstream_model=rnd.choice(["u1", "u2"]), upstream=rnd.choice(["x", "y"]),
            replica=rnd.choice(["r1", "r2"]), input_tokens=rnd.randrange(500), output_tokens=rnd.randrange(200),
            cache_read_tokens=rnd.randrange(300), cache_creation_tokens=rnd.randrange(50), status=status,
            error_type=None if status == 200 else "api_error", ttft=rnd.choice([None, rnd.expovariate(2.0)]),
            web_search_requests=rnd.randrange(2),
        ))  # fmt: skip
    return records


async def _raw(store: Store, query: Query) -> list[Sums]:
    """What the records alone answer (the query the store ran before rollups)."""
    if isinstance(store, SqliteStore):
        sql, args = sums_sql(query, "sqlite")
        return sums_of(store._connection().execute(sql, args).fetchall(), query)
    sql, args = sums_sql(query, "postgres")
    async with store._pool.acquire() as connection:
        return sums_of([tuple(row) for row in await connection.fetch(sql, *args)], query)


def _sorted(sums: list[Sums]) -> list[Sums]:
    return sorted(sums, key=lambda s: (s.bucket, str(s.groups)))


QUERIES = [
    Query(BASE, BASE + 4 * 86400, ttft=True),
    Query(BASE + 7, BASE + 3 * 86400, 3600, ttft=True),
    Query(BASE - 13.5, BASE + 2.5 * 86400 + 7, 3600, ("api_key_id",)),
    Query(BASE // 86400 * 86400, BASE // 86400 * 86400 + 4 * 86400, 86400, ("model", "tenant")),
    Query(BASE + 61, BASE + 3 * 3600 + 5, 60, ("model",), key_ids=("key_a",), ttft=True),
    Query(BASE - 3000, BASE + 2 * 86400 + 3000, 60, ("tenant",)),
    Query(BASE - 3000, BASE + 2 * 86400, 3600, ("model",), refusals=True),
    Query(BASE + 5, BASE + 2 * 86400, 0, ("api_key_id", "tenant", "model", "upstream_model"), refusals=False),
    Query(BASE, BASE + 86400 * 3, 86400, ("api_key_id",), refusals=True, models=("m2",)),
    Query(BASE + 100, BASE + 86400, 0, ("upstream", "replica")),
    Query(BASE + 100, BASE + 86400, 3600, ("replica", "model")),  # no grain keeps both: the records answer
]


def _run(make: Callable[[], Store], body: Callable[[Store], Awaitable[None]]) -> None:
    async def run() -> None:
        store = make()
        await store.open()
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(run())


def test_every_query_answers_what_the_records_answer(make: Callable[[], Store]) -> None:
    async def body(store: Store) -> None:
        await store.write(_records(1500))
        for query in QUERIES:
            got = await store.sums(query)
            assert _sorted(got) == _sorted(await _raw(store, query)), query
            assert sum(s.requests for s in got) > 0, query
            assert all(len(s.ttft) == (len(TTFT_COLUMNS) if query.ttft else 0) for s in got)

    _run(make, body)


def test_plain_rows_are_the_sums_in_their_order(make: Callable[[], Store]) -> None:
    counters = ("requests", "output_tokens", "errors", "cache_read_tokens")

    async def body(store: Store) -> None:
        await store.write(_records(1500))
        for query in QUERIES:
            expected = [((s.bucket,) if query.width else ()) + s.groups + tuple(getattr(s, c) for c in counters) + s.ttft
                        for s in await store.sums(query)]  # fmt: skip
            assert await store.rows(query, counters) == expected, query

    _run(make, body)


def test_a_record_written_twice_counts_once(make: Callable[[], Store]) -> None:
    async def body(store: Store) -> None:
        records = _records(400, seed=2)
        await store.write(records[:300])
        await store.write(records[200:] + records[:10])  # a journal shipped again, a write retried
        await store.write([records[5], records[5]])
        whole = Query(BASE // 86400 * 86400, BASE // 86400 * 86400 + 5 * 86400, 86400)
        assert sum(s.requests for s in await store.sums(whole)) == 400
        assert _sorted(await store.sums(whole)) == _sorted(await _raw(store, whole))

    _run(make, body)


def test_every_field_reads_back_as_written(make: Callable[[], Store]) -> None:
    """PostgreSQL takes a batch apart from JSON: quotes, escapes, non-ASCII text, nulls,
    booleans, floats and large counts come back as they went in."""
    odd = replace(usage_record("req_\"odd\\", BASE + 0.123456), key_id="key_é✓", tenant=None,
                  model='m "quoted"\nline', upstream_model="ü" * 300, input_tokens=2**40, status=529,
                  error_type="overloaded_error", disconnected=True, duration=1 / 3, ttft=1e-05,
                  cache_creation_tokens=7, cache_creation_1h_tokens=3, web_fetch_requests=2, route="r")  # fmt: skip
    plain = usage_record("req_plain", BASE + 1.5)

    async def body(store: Store) -> None:
        await store.write([odd, plain])
        assert sorted(await store.recent(10), key=lambda r: r.request_id) == [odd, plain]

    _run(make, body)


def test_pruning_keeps_the_hour_and_day_rollups(make: Callable[[], Store]) -> None:
    async def body(store: Store) -> None:
        await store.write(_records(300, seed=3))
        day = BASE // 86400 * 86400
        before = await store.sums(Query(day, day + 5 * 86400, 3600))
        assert await store.prune(day + 2 * 86400) > 0
        assert _sorted(await store.sums(Query(day, day + 5 * 86400, 3600))) == _sorted(before)
        by_minute = await store.sums(Query(day, day + 5 * 86400, 60))
        assert min(s.bucket for s in by_minute) >= day + 2 * 86400

    _run(make, body)


def test_the_report_reads_the_same_numbers_as_from_the_records(
    make: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    params = {"starting_at": ["2023-11-14T10:00:00Z"], "ending_at": ["2023-11-17T09:30:00Z"], "bucket_width": ["1h"],
              "limit": ["168"], "group_by[]": ["api_key_id", "model"]}  # fmt: skip

    async def body(store: Store) -> None:
        await store.write(_records(800, seed=4))
        rolled = await report(store, ReportQuery(params))
        monkeypatch.setattr(reading, "grain_for", lambda query: None)
        assert await report(store, ReportQuery(params)) == rolled
        assert sum(len(b["results"]) for b in rolled["data"]) > 10

    _run(make, body)


def test_a_database_of_before_the_rollups_gets_them_for_its_records(
    make: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dragoman.usage import postgres, schema, sqlite

    old = [(v, steps) for v, steps in schema.MIGRATIONS if v <= 5]
    records = _records(500, seed=5)

    async def before(store: Store) -> None:
        if isinstance(store, SqliteStore):  # the records as an older dragoman wrote them: no rollups
            store._connection().executemany(schema.insert_sql("sqlite"), [astuple(r) for r in records])
        else:
            async with store._pool.acquire() as connection:
                await connection.executemany(schema.insert_sql("postgres"), [astuple(r) for r in records])

    for module in (sqlite, postgres):
        monkeypatch.setattr(module, "MIGRATIONS", old)
        monkeypatch.setattr(module, "LATEST", 5)
    _run(make, before)
    monkeypatch.undo()

    async def after(store: Store) -> None:
        for query in QUERIES:
            assert _sorted(await store.sums(query)) == _sorted(await _raw(store, query)), query

    _run(make, after)


def test_the_latest_requests_read_an_index(tmp_path: Path) -> None:
    async def body(store: Store) -> None:
        await store.write(_records(50, seed=6))

    _run(lambda: SqliteStore(tmp_path), body)
    db = sqlite3.connect(tmp_path / "usage.sqlite3")
    for failures, key, index in ((None, None, "usage_records_at"), (True, None, "usage_records_failures"),
                                 (None, "key_a", "usage_records_key_at")):  # fmt: skip
        sql, args = reading.recent_sql("sqlite", 10, failures, key)
        plan = " ".join(str(row) for row in db.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert index in plan and "TEMP B-TREE" not in plan, plan


def test_latest_requests_newest_first_failures_and_of_one_key(make: Callable[[], Store]) -> None:
    async def body(store: Store) -> None:
        records = _records(200, seed=7)
        await store.write(records)
        newest = sorted(records, key=lambda r: -r.at)
        assert [r.request_id for r in await store.recent(5)] == [r.request_id for r in newest[:5]]
        failed = [r.request_id for r in newest if r.error_type is not None][:5]
        assert [r.request_id for r in await store.recent(5, failures=True)] == failed
        mine = await store.recent(300, key_id="key_b")
        assert mine and all(r.key_id == "key_b" for r in mine)
        (one,) = await store.recent(1)
        assert one.request_id == newest[0].request_id and one.disconnected is False
        assert one.at == pytest.approx(newest[0].at, abs=1e-6)

    _run(make, body)


def test_quantiles_come_from_the_histogram() -> None:
    times = [0.05] * 50 + [0.3] * 45 + [4.0] * 5
    histogram = [0] * len(TTFT_COLUMNS)
    for t in times:
        histogram[ttft_bucket(t)] += 1
    p50, p95 = quantile(histogram, 0.5), quantile(histogram, 0.95)
    assert p50 is not None and 0.04 <= p50 <= 0.0566
    assert p95 is not None and 0.2 <= p95 <= 0.32
    assert quantile([0] * len(TTFT_COLUMNS), 0.5) is None
    assert quantile([0] * (len(TTFT_COLUMNS) - 1) + [3], 0.5) == TTFT_BOUNDS[-1]
    assert ttft_bucket(0.0) == 0 and ttft_bucket(TTFT_BOUNDS[0]) == 1 and ttft_bucket(1e9) == len(TTFT_BOUNDS)


@pytest.mark.parametrize(
    ("start", "end"),
    [(100.5, 90000.2), (86400.0, 172800.0), (BASE, BASE + 59), (BASE + 1e-6, BASE + 7 * 86400 - 1e-6), (0.0, 1.0)],
)
def test_a_range_is_tiled_by_whole_buckets_and_edges(start: float, end: float) -> None:
    cut = reading.pieces(start, end, (86400, 3600, 60))
    assert cut[0][1] == start and cut[-1][2] == end
    assert all(a[2] == b[1] for a, b in zip(cut, cut[1:], strict=False))
    for width, a, b in cut:
        assert a < b and (width == 0 and b - a < 60 or width and a % width == 0 == b % width)
