"""The console's data functions over a real gateway and its SQLite usage store: records
written straight to the store, then each view read back; the usage view equals the usage
report; bad arguments are named."""

from __future__ import annotations

import asyncio
import csv
import io
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from dragoman.assembly.gateway import Gateway
from dragoman.console import data
from dragoman.core.config_load import from_dict
from dragoman.core.errors import InvalidRequest
from dragoman.usage.report import ReportQuery, report
from tests.support.usage import usage_record

ADMIN = "sk-admin-console-test"


def _gateway(tmp_path: Path) -> Gateway:
    config = from_dict({
        "server": {"registry_cache": "", "default_model": "m", "tenants": {"team": ["sk-team-key"]}},
        "usage": {"dir": str(tmp_path / "usage"), "admin_keys": [ADMIN]},
        "batches": {"dir": str(tmp_path / "batches")}, "files": {"dir": str(tmp_path / "files")},
        "upstreams": {"up": {"url": "http://127.0.0.1:9/v1", "replicas": ["http://127.0.0.1:10/v1"]}},
    })  # fmt: skip
    return Gateway(config)


def _run(tmp_path: Path, body: Callable[[Gateway], Awaitable[None]]) -> None:
    async def run() -> None:
        gateway = _gateway(tmp_path)
        try:
            await body(gateway)
        finally:
            await gateway.close()

    asyncio.run(run())


def _records(now: float) -> list[Any]:
    base = replace(usage_record("x", now), upstream="up")
    return [
        replace(base, request_id="a", at=now - 30, key_id="key_a", model="m1", input_tokens=10, output_tokens=5,
                cache_read_tokens=30, ttft=0.2, replica="http://127.0.0.1:9"),
        replace(base, request_id="b", at=now - 20, key_id="key_a", model="m2", input_tokens=20, output_tokens=7,
                status=500, error_type="api_error", ttft=1.5, replica="http://127.0.0.1:9"),
        replace(base, request_id="c", at=now - 2 * 3600, key_id="key_b", model="m1", input_tokens=1, output_tokens=1),
        replace(base, request_id="d", at=now - 10, key_id=None, model="m1", status=401,
                error_type="authentication_error", input_tokens=0, output_tokens=0),
    ]  # fmt: skip


def test_overview_sums_each_bucket_and_the_period(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        now = time.time()
        store = await data.store_of(gateway)
        await store.write(_records(now))
        hour = await data.overview(gateway, "hour")
        assert hour["bucket_width"] == "1m" and len(hour["series"]) == 60
        totals = hour["totals"]
        assert (totals["requests"], totals["input_tokens"], totals["output_tokens"], totals["errors"]) == (3, 30, 12, 2)
        assert totals["cache_hit_rate"] == pytest.approx(30 / 60)
        assert 0.14 <= totals["ttft_p50"] <= 1.5 and totals["ttft_p95"] <= 2.0
        assert sum(p["requests"] for p in hour["series"]) == 3
        assert all(b["t"] - a["t"] == 60 for a, b in zip(hour["series"], hour["series"][1:], strict=False))
        day = await data.overview(gateway, "day")
        assert day["totals"]["requests"] == 4 and len(day["series"]) == 24
        assert len((await data.overview(gateway, "week"))["series"]) == 168

    _run(tmp_path, body)


def test_usage_equals_the_usage_report_and_its_csv_the_rows(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        now = time.time()
        store = await data.store_of(gateway)
        await store.write(_records(now))
        start = now - 86400
        shown = await data.usage(gateway, start, now + 60, "1h", "key")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 60))
        query = ReportQuery({"starting_at": [stamp], "ending_at": [end], "bucket_width": ["1h"], "limit": ["168"],
                             "group_by[]": ["api_key_id"]})  # fmt: skip
        page = await report(store, query)
        reported = {(b["starting_at"], r["api_key_id"]): (r["uncached_input_tokens"], r["output_tokens"])
                    for b in page["data"] for r in b["results"]}  # fmt: skip
        mine = {(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s["t"])), s["group"]): (s["input_tokens"],
                s["output_tokens"]) for s in shown["series"]}  # fmt: skip
        assert mine == reported and len(mine) >= 2
        assert {g["group"] for g in shown["groups"]} == {"key_a", "key_b", None}
        rows = list(csv.reader(io.StringIO(await data.usage_csv(gateway, start, now + 60, "1h", "key"))))
        assert tuple(rows[0]) == data.CSV_COLUMNS and len(rows) == 1 + len(shown["series"])
        by_model = await data.usage(gateway, start, now + 60, "1d", "model")
        assert {g["group"]: g["requests"] for g in by_model["groups"]} == {"m1": 3, "m2": 1}

    _run(tmp_path, body)


def test_usage_shows_the_top_groups_and_the_rest_together(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        now = time.time()
        base = usage_record("x", now)
        await (await data.store_of(gateway)).write([
            replace(base, request_id=f"r{k}{i}", at=now - 60 * i - 1, key_id=f"key_{k}", input_tokens=100 * (k + 1))
            for k in range(5) for i in range(3)
        ] + [replace(base, request_id="anonymous", at=now - 1, key_id=None, input_tokens=10_000)])  # fmt: skip
        shown = await data.usage(gateway, now - 3600, now + 60, "1m", "key", top=2)
        assert [g["group"] for g in shown["groups"]] == ["key_4", "key_3", data.OTHER]
        other = shown["groups"][-1]
        assert other["other"] and other["requests"] == 3 * 3 + 1 and other["input_tokens"] == 10_000 + 3 * 600
        whole = await data.overview(gateway, "hour")
        for t in shown["buckets"]:
            rows = [r for r in shown["series"] if r["t"] == t]
            point = next((p for p in whole["series"] if p["t"] == t), None)
            assert sum(r["requests"] for r in rows) == (point["requests"] if point else 0)
        every = await data.usage(gateway, now - 3600, now + 60, "1h", "key", top=10)
        assert len(every["groups"]) == 6 and not any(g["other"] for g in every["groups"])

    _run(tmp_path, body)


def test_requests_newest_first_and_failures_first(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        now = time.time()
        await (await data.store_of(gateway)).write(_records(now))
        rows = (await data.requests(gateway, limit=3))["data"]
        assert [r["request_id"] for r in rows] == ["d", "b", "a"]
        rows = (await data.requests(gateway, limit=3, failures_first=True))["data"]
        assert [r["request_id"] for r in rows] == ["d", "b", "a"]
        rows = (await data.requests(gateway, limit=50, failures_first=True))["data"]
        assert [r["request_id"] for r in rows] == ["d", "b", "a", "c"]
        assert rows[1]["replica"] == "http://127.0.0.1:9" and rows[1]["error_type"] == "api_error"
        assert [r["request_id"] for r in (await data.requests(gateway, key_id="key_a"))["data"]] == ["b", "a"]

    _run(tmp_path, body)


def test_replicas_lists_each_upstream_s_replicas_with_their_last_hour(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        await (await data.store_of(gateway)).write(_records(time.time()))
        shown = await data.replicas(gateway)
        (upstream,) = shown["upstreams"]
        assert upstream["name"] == "up"
        first, second = upstream["replicas"]
        assert (first["name"], second["name"]) == ("http://127.0.0.1:9", "http://127.0.0.1:10")
        assert first["healthy"] is True and first["in_flight"] == 0 and first["running"] is None
        assert first["requests"] == 2 and first["cache_hit_rate"] == pytest.approx(30 / 60)
        assert second["requests"] == 0 and second["cache_hit_rate"] is None

    _run(tmp_path, body)


def test_me_shows_a_key_its_budget_and_its_day(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        store = await data.store_of(gateway)  # (the writer's task, not started here, would open it)
        assert gateway.keyring.store is not None
        await gateway.keyring.store.open()  # as the keyring's task would: not started here, its
        # poll's thread may outlive close() (keys/connections.py), and SQLite crashes then
        gateway.keyring.opened = True
        made = await gateway.key_admin.create(
            b'{"name": "alice", "budget": {"amount": "500", "currency": "USD", "period": "day"}}', "admin"
        )
        now = time.time()
        await store.write([replace(r, key_id=made["id"]) for r in _records(now)[:2]])
        shown = await data.me(gateway, made["id"])
        assert shown["key"]["name"] == "alice" and shown["key"]["status"] == "active"
        assert shown["key"]["budget_used"] == "0" and shown["key"]["budget_remaining"] == "500"
        assert shown["usage"]["totals"]["requests"] == 2 and len(shown["usage"]["series"]) == 24

    _run(tmp_path, body)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda g: data.overview(g, "month"), "period"),
        (lambda g: data.usage(g, 0, 3600, "5m", "key"), "bucket"),
        (lambda g: data.usage(g, 0, 3600, "1h", "replica"), "group_by"),
        (lambda g: data.usage(g, 3600, 0, "1h", "key"), "start"),
        (lambda g: data.usage(g, 0, 86400 * 30, "1m", "key"), "bucket"),
        (lambda g: data.requests(g, limit=0), "limit"),
        (lambda g: data.usage(g, 0, 3600, "1h", "key", top=0), "top"),
    ],
)
def test_a_bad_argument_is_named(tmp_path: Path, call: Callable[[Gateway], Awaitable[Any]], named: str) -> None:
    async def body(gateway: Gateway) -> None:
        with pytest.raises(InvalidRequest) as raised:
            await call(gateway)
        assert raised.value.message.startswith(f"{named}:")

    _run(tmp_path, body)


def test_overview_buckets_end_with_the_current_one(tmp_path: Path) -> None:
    async def body(gateway: Gateway) -> None:
        shown = await data.overview(gateway, "day")
        assert shown["end"] == (math.floor(time.time() / 3600) + 1) * 3600
        assert shown["totals"]["requests"] == 0 and shown["totals"]["ttft_p50"] is None

    _run(tmp_path, body)
