"""Usage accounting in the tests: a team's gateway config (two tenants, an admin key), the
usage report read with the SDK, waiting for records, and records made by hand and written."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import anthropic

from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

KEYS = {"team-a": "key-a", "team-b": "key-b"}
ADMIN = "admin-key"
MODELS = ("model-a", "native-model")  # translated (an OpenAI upstream), passed through (an Anthropic one)


def team_config(upstream_url: str, usage: dict[str, Any], native_url: str | None = None) -> dict[str, Any]:
    upstreams: dict[str, Any] = {"default": {"url": upstream_url, "max_retries": 0}}
    if native_url:
        upstreams["native"] = {"url": native_url, "protocol": "anthropic", "max_retries": 0}
    return {
        "server": {"tenants": {tenant: [key] for tenant, key in KEYS.items()}},
        "usage": {"admin_keys": [ADMIN], **usage},
        "upstreams": upstreams,
    }


def report(url: str, **params: Any) -> dict[str, Any]:
    admin = anthropic.Anthropic(base_url=url, api_key=ADMIN, max_retries=0)
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    query = {"starting_at": start.isoformat(), "bucket_width": "1d", **params}
    return admin.get("/v1/organizations/usage_report/messages", cast_to=object, options={"params": query})  # type: ignore[return-value]


def wait_recorded(server: GatewayServer, count: int) -> None:
    """Until the gateway has finished `count` requests (a disconnect is noticed a moment later)."""
    requests = server.app.state.gateway.metrics.requests
    finished = lambda: sum(s.value for s in requests.collect()[0].samples if s.name.endswith("_total")) >= count  # noqa: E731
    eventually(finished, f"{count} requests recorded", timeout=10)


def usage_record(request_id: str, at: float) -> Any:
    """A usage record of one request at `at` (a Unix time)."""
    from dragoman.usage.records import UsageRecord

    return UsageRecord(at=at, request_id=request_id, endpoint="messages", key_id=None, tenant=None, model="m",
                       upstream_model="m", upstream="u", replica="r", input_tokens=1, cache_read_tokens=0,
                       output_tokens=1, status=200, error_type=None, disconnected=False, duration=0.1, ttft=None)  # fmt: skip


def write_records(store: Any, records: list[Any]) -> None:
    """`records` written straight to a usage store (SQLite or PostgreSQL), opened and closed here."""

    async def write() -> None:
        await store.open()
        try:
            await store.write(records)
        finally:
            await store.close()

    asyncio.run(write())
