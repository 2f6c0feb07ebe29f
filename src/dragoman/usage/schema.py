"""The usage table, its versioned migrations, and the one aggregate query, for both
SQLite and PostgreSQL. A migration is applied once, in order, in the transaction that
records its version; the stores run them under a lock that serializes processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from dragoman.usage import rollups
from dragoman.usage.records import Query, Sums
from dragoman.usage.rollups import ttft_sums

Dialect = Literal["sqlite", "postgres"]

VERSIONS_TABLE = "dragoman_usage_schema"
CREATE_VERSIONS = (
    f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} (version INTEGER PRIMARY KEY, applied_at {{time}} NOT NULL)"
)

# (version, {dialect: statements}); append only: a released migration never changes.
MIGRATIONS: list[tuple[int, dict[Dialect, list[str]]]] = [
    (
        1,
        {
            "sqlite": [
                """CREATE TABLE usage_records (
                    request_id TEXT PRIMARY KEY, at REAL NOT NULL, endpoint TEXT NOT NULL, key_id TEXT, tenant TEXT,
                    model TEXT NOT NULL, upstream_model TEXT NOT NULL, upstream TEXT NOT NULL, replica TEXT NOT NULL,
                    input_tokens INTEGER NOT NULL, cache_read_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
                    status INTEGER NOT NULL, error_type TEXT, disconnected INTEGER NOT NULL,
                    duration REAL NOT NULL, ttft REAL)""",
                "CREATE INDEX usage_records_at ON usage_records (at)",
            ],
            "postgres": [
                """CREATE TABLE usage_records (
                    request_id TEXT PRIMARY KEY, at TIMESTAMPTZ NOT NULL, endpoint TEXT NOT NULL, key_id TEXT,
                    tenant TEXT, model TEXT NOT NULL, upstream_model TEXT NOT NULL, upstream TEXT NOT NULL,
                    replica TEXT NOT NULL, input_tokens BIGINT NOT NULL, cache_read_tokens BIGINT NOT NULL,
                    output_tokens BIGINT NOT NULL, status INTEGER NOT NULL, error_type TEXT,
                    disconnected BOOLEAN NOT NULL, duration DOUBLE PRECISION NOT NULL, ttft DOUBLE PRECISION)""",
                "CREATE INDEX usage_records_at ON usage_records (at)",
            ],
        },
    ),
    (
        2,  # prompt-cache writes (the report's cache_creation); records of before have none
        {
            "sqlite": [
                "ALTER TABLE usage_records ADD COLUMN cache_creation_tokens INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE usage_records ADD COLUMN cache_creation_1h_tokens INTEGER NOT NULL DEFAULT 0",
            ],
            "postgres": [  # a constant default: no table rewrite (PostgreSQL 11 and later)
                "ALTER TABLE usage_records ADD COLUMN cache_creation_tokens BIGINT NOT NULL DEFAULT 0",
                "ALTER TABLE usage_records ADD COLUMN cache_creation_1h_tokens BIGINT NOT NULL DEFAULT 0",
            ],
        },
    ),
    (
        3,  # server tools the gateway ran (dragoman.servertools); records of before ran none
        {
            "sqlite": [
                "ALTER TABLE usage_records ADD COLUMN web_search_requests INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE usage_records ADD COLUMN web_fetch_requests INTEGER NOT NULL DEFAULT 0",
            ],
            "postgres": [
                "ALTER TABLE usage_records ADD COLUMN web_search_requests BIGINT NOT NULL DEFAULT 0",
                "ALTER TABLE usage_records ADD COLUMN web_fetch_requests BIGINT NOT NULL DEFAULT 0",
            ],
        },
    ),
    (
        4,  # the [[routes]] entry a request took (dragoman.routes); records of before have none
        {
            "sqlite": ["ALTER TABLE usage_records ADD COLUMN route TEXT"],
            "postgres": ["ALTER TABLE usage_records ADD COLUMN route TEXT"],
        },
    ),
]

RECENT_INDEXES = [
    "CREATE INDEX usage_records_key_at ON usage_records (key_id, at)",
    "CREATE INDEX usage_records_failures ON usage_records (at) WHERE error_type IS NOT NULL",
]
MIGRATIONS += [
    (
        5,  # the console's latest requests: of one key, and failures first (a partial index: failures are few)
        {"sqlite": RECENT_INDEXES, "postgres": RECENT_INDEXES},
    ),
    (6, {"sqlite": rollups.create_statements("sqlite"), "postgres": rollups.create_statements("postgres")}),
]  # (6: per minute, hour and day, filled from the records stored so far; see usage.rollups)

LATEST = MIGRATIONS[-1][0]

COLUMNS = (
    "at",
    "request_id",
    "endpoint",
    "key_id",
    "tenant",
    "model",
    "upstream_model",
    "upstream",
    "replica",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "status",
    "error_type",
    "disconnected",
    "duration",
    "ttft",
    "cache_creation_tokens",
    "cache_creation_1h_tokens",
    "web_search_requests",
    "web_fetch_requests",
    "route",
)  # fmt: skip  (UsageRecord's fields, in order)


REFUSALS = (401, 403)  # a key refused: no one's usage (`dragoman usage` counts them apart)
SUMMED = ("input_tokens", "cache_read_tokens", "output_tokens", "cache_creation_tokens", "cache_creation_1h_tokens",
          "web_search_requests", "web_fetch_requests")  # fmt: skip


def insert_sql(dialect: Dialect) -> str:
    """One record's INSERT; a record written twice (a commit whose answer was lost) counts once."""
    names = ", ".join(COLUMNS)
    if dialect == "sqlite":
        return f"INSERT OR IGNORE INTO usage_records ({names}) VALUES ({', '.join('?' * len(COLUMNS))})"
    values = ", ".join("to_timestamp($1)" if i == 1 else f"${i}" for i in range(1, len(COLUMNS) + 1))
    return f"INSERT INTO usage_records ({names}) VALUES ({values}) ON CONFLICT (request_id) DO NOTHING"


def sums_sql(query: Query, dialect: Dialect, counters: tuple[str, ...] = rollups.COUNTED) -> tuple[str, list[object]]:
    """The aggregate query for `query`, and its arguments: the groups, then `counters`
    (of `rollups.COUNTED`, "requests" first), then the TTFT histogram if asked."""
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return "?" if dialect == "sqlite" else f"${len(args)}"

    epoch = "at" if dialect == "sqlite" else "extract(epoch from at)"
    time: Callable[[float], str] = (lambda t: arg(t)) if dialect == "sqlite" else (lambda t: f"to_timestamp({arg(t)})")
    columns = [{"api_key_id": "key_id"}.get(g, g) for g in query.group_by]
    if query.width:  # the bucket's start: the epoch is a UTC midnight, so days are UTC days
        width = str(int(query.width))  # a number of ours (WIDTH_SECONDS), not the client's text
        columns.insert(0, f"CAST(floor({epoch} / {width}) * {width} AS BIGINT)" if dialect == "postgres"
                          else f"(CAST({epoch} / {width} AS INTEGER) * {width})")  # fmt: skip
    where = [f"at >= {time(float(query.start))}", f"at < {time(float(query.end))}"]
    for column, values in (("key_id", query.key_ids), ("model", query.models), ("tenant", query.tenants)):
        if values:
            where.append(f"{column} IN ({', '.join(arg(v) for v in values)})")
    if query.refusals is not None:  # statuses of ours, not the client's text
        where.append(f"status {'IN' if query.refusals else 'NOT IN'} ({', '.join(map(str, REFUSALS))})")
    special = {"requests": "count(*)", "errors": "CAST(sum(CASE WHEN error_type IS NULL THEN 0 ELSE 1 END) AS BIGINT)"}
    sums = [special.get(c, f"CAST(sum({c}) AS BIGINT)") for c in counters]
    sums += ttft_sums() if query.ttft else []
    keys = ", ".join(str(i) for i in range(1, len(columns) + 1))  # by position: grouped and ordered alike
    sql = (f"SELECT {', '.join([*columns, *sums])} FROM usage_records "
           f"WHERE {' AND '.join(where)}" + (f" GROUP BY {keys} ORDER BY {keys}" if columns else ""))  # fmt: skip
    return sql, args


def sums_of(rows: list[tuple[object, ...]], query: Query) -> list[Sums]:
    """The query's rows (as both drivers give them) as `Sums`. (Called for every row of a
    chart: kept to one tuple and one constructor a row.)"""
    result = []
    at = 1 if query.width else 0
    first = at + len(query.group_by)  # the count's column
    tail = first + 2 + len(SUMMED)  # the TTFT histogram's first
    for row in rows:
        if not row[first]:  # an aggregate over no rows is one row of zeros (or NULLs); else no sum is NULL
            continue
        v = row[first:]
        bucket = float(row[0]) if at else query.start  # type: ignore[arg-type]
        ttft = tuple(v[tail - first :]) if query.ttft else ()
        result.append(Sums(bucket, row[at:first], *v[:1], *v[2:5], v[1], *v[5 : tail - first], ttft))  # type: ignore[arg-type,call-arg]
    return result
