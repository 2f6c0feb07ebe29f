"""The console's JSON endpoints, one per view (a live view polls its one endpoint, at most
every 5 s), and the key changes, made by the Admin API's own logic (`keys.admin.KeyAdmin`)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from dragoman.console import data, gate
from dragoman.core.errors import InvalidRequest, RequestTooLarge

PERIODS = {"hour": 3600, "day": 86400, "week": 7 * 86400, "month": 30 * 86400}
BUCKETS = {"1m": 60, "1h": 3600, "1d": 86400}
GROUPS = ("key", "tenant", "model")
MAX_BUCKETS = 1440  # a chart's points per series (data.MAX_BUCKETS): a week by the minute is refused
MAX_BODY = 64 * 1024
MAX_KEYS = 10_000  # rows the keys table loads


def _json(value: object) -> Response:
    return Response(msgspec.json.encode(value), media_type="application/json", headers={"cache-control": "no-store"})


def _choice(request: Request, name: str, allowed: Any, default: str) -> str:
    value = request.query_params.get(name, default)
    if value not in allowed:
        raise InvalidRequest(f"{name}: one of {', '.join(allowed)}, got {value[:20]!r}")
    return value


async def overview(request: Request) -> Response:
    found = await gate.visit(request, page=False)
    return _json(await data.overview(found.gateway, _choice(request, "period", ("hour", "day", "week"), "hour")))


def window(request: Request) -> tuple[float, float, str, str]:
    """(start, end, bucket, group_by) of a usage request: the last `period`, in whole buckets."""
    period = _choice(request, "period", PERIODS, "day")
    bucket = _choice(request, "bucket", BUCKETS, "1h")
    group_by = _choice(request, "group_by", GROUPS, "key")
    if PERIODS[period] // BUCKETS[bucket] > MAX_BUCKETS:
        raise InvalidRequest(f"bucket: {bucket} buckets over a {period} are too many points; choose a wider bucket")
    step = BUCKETS[bucket]
    end = (int(time.time()) // step + 1) * step  # the current bucket included, whole
    return float(end - PERIODS[period] // step * step), float(end), bucket, group_by


async def usage(request: Request) -> Response:
    found = await gate.visit(request, page=False)
    start, end, bucket, group_by = window(request)
    shown = await data.usage(found.gateway, start, end, bucket, group_by)
    return _json({**shown, "start": start, "end": end, "group_by": group_by})


async def usage_csv(request: Request) -> Response:
    """The CSV of exactly what the chart shows: the same window, bucket and grouping."""
    found = await gate.visit(request, page=False)
    start, end, bucket, group_by = window(request)
    text = await data.usage_csv(found.gateway, start, end, bucket, group_by)
    name = f"dragoman-usage-{group_by}-{bucket}-{int(start)}-{int(end)}.csv"
    return Response(text, media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{name}"', "cache-control": "no-store"})  # fmt: skip


async def replicas(request: Request) -> Response:
    found = await gate.visit(request, page=False)
    return _json(await data.replicas(found.gateway))


async def requests(request: Request) -> Response:
    found = await gate.visit(request, page=False)
    failures_first = request.query_params.get("failures_first", "") in ("1", "true")
    return _json(await data.requests(found.gateway, limit=50, failures_first=failures_first))


async def me(request: Request) -> Response:
    found = await gate.visit(request, page=False, admin=False)
    return _json(await data.me(found.gateway, found.grant.id))


async def keys(request: Request) -> Response:
    """Every key (the Admin API's list, paged through), for the table's own search and sort."""
    found = await gate.visit(request, page=False)
    listed: list[dict[str, Any]] = []
    query: dict[str, str] = {"limit": "1000"}
    while len(listed) < MAX_KEYS:
        page = await found.gateway.key_admin.guard(found.gateway.key_admin.page(query))
        listed += page["data"]
        if not page["has_more"]:
            break
        query["after_id"] = page["last_id"]
    return _json({"data": listed})


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {MAX_BODY} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise RequestTooLarge(f"request body is over the limit of {MAX_BODY} bytes")
    return body


def _noted(request: Request, action: str, key_id: str) -> None:
    """The change named in the request's access-log line, as the Admin API's are."""
    request.scope.setdefault("state", {})["admin"] = {"admin_action": action, "api_key_id": key_id}


async def create_key(request: Request) -> Response:
    found = await gate.changing(request)
    made = await found.gateway.key_admin.guard(found.gateway.key_admin.create(await _body(request), found.grant.id))
    _noted(request, "create", made["id"])
    return _json(made)


async def update_key(request: Request) -> Response:
    found = await gate.changing(request)
    key = request.path_params["api_key_id"]
    changed = await found.gateway.key_admin.guard(
        found.gateway.key_admin.update(key, await _body(request), found.grant.id)
    )
    _noted(request, "update", key)
    return _json(changed)
