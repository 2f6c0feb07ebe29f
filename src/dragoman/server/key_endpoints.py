"""The Admin API: API keys (`/v1/organizations/api_keys`) and the cost report, for admin
keys only. Each change is named in its access-log line (action and key id)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dragoman.core.errors import NotFound
from dragoman.keys.admin import KeyAdmin
from dragoman.keys.cost import CostQuery, cost_report
from dragoman.keys.wiring import prices
from dragoman.server import auth
from dragoman.server.endpoints import _gateway, _read_body, struct_response

MAX_BODY = 64 * 1024


def _keys(request: Request) -> KeyAdmin:
    """This gateway's key operations; their `guard` answers 503 while the database is out."""
    return _gateway(request).key_admin


async def _admin(request: Request) -> str:
    return auth.check_admin(request, _gateway(request).keyring).id


def _noted(request: Request, action: str, key_id: str) -> None:
    request.scope.setdefault("state", {})["admin"] = {"admin_action": action, "api_key_id": key_id}


async def create(request: Request) -> Response:
    actor = await _admin(request)
    keys = _keys(request)
    made = await keys.guard(keys.create(await _read_body(request, MAX_BODY), actor))
    _noted(request, "create", made["id"])
    return struct_response(made)


async def list_keys(request: Request) -> Response:
    await _admin(request)
    keys = _keys(request)
    return struct_response(await keys.guard(keys.page(request.query_params)))


async def retrieve(request: Request) -> Response:
    await _admin(request)
    keys = _keys(request)
    return struct_response(await keys.guard(keys.retrieve(request.path_params["api_key_id"])))


async def update(request: Request) -> Response:
    actor = await _admin(request)
    key = request.path_params["api_key_id"]
    keys = _keys(request)
    changed = await keys.guard(keys.update(key, await _read_body(request, MAX_BODY), actor))
    _noted(request, "update", key)
    return struct_response(changed)


async def delete(request: Request) -> Response:
    actor = await _admin(request)
    key = request.path_params["api_key_id"]
    keys = _keys(request)
    gone = await keys.guard(keys.delete(key, actor))
    _noted(request, "delete", key)
    return struct_response(gone)


async def costs(request: Request) -> Response:
    """GET /v1/organizations/cost_report: what this process holds is written first."""
    await _admin(request)
    gateway = _gateway(request)
    if gateway.usage is None:
        raise NotFound("usage accounting is off (usage.enabled = false): there is nothing to price")
    params = request.query_params
    query = CostQuery({name: params.getlist(name) for name in params.keys()})
    guard = gateway.usage.guard  # the database down or locked: 503, as the usage report
    if not await guard(asyncio.shield(gateway.usage.flush())):
        raise guard.refused()
    return struct_response(await guard(cost_report(gateway.usage.store, prices(gateway.config), query)))


def routes(prefix: str) -> list[Route]:
    keys, one = f"{prefix}/organizations/api_keys", prefix + "/organizations/api_keys/{api_key_id}"
    return [
        Route(keys, create, methods=["POST"], name="api_keys.create"),
        Route(keys, list_keys, methods=["GET"], name="api_keys.list"),
        Route(one, retrieve, methods=["GET"], name="api_keys.retrieve"),
        Route(one, update, methods=["POST"], name="api_keys.update"),
        Route(one, delete, methods=["DELETE"], name="api_keys.delete"),
        Route(f"{prefix}/organizations/cost_report", costs, methods=["GET"], name="cost_report"),
    ]
