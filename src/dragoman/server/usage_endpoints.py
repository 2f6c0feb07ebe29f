"""The usage report (Anthropic's Admin API shape), for admin keys only."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from dragoman.core.errors import NotFound
from dragoman.server import auth
from dragoman.server.endpoints import _gateway, struct_response
from dragoman.usage.report import ReportQuery, report


async def messages_report(request: Request) -> Response:
    """GET /v1/organizations/usage_report/messages: what this process holds is written
    first, so that a report includes every request finished before it was asked for."""
    gateway = _gateway(request)
    auth.check_admin(request, gateway.keyring)
    if gateway.usage is None:
        raise NotFound("usage accounting is off (usage.enabled = false)")
    params = request.query_params
    query = ReportQuery({name: params.getlist(name) for name in params.keys()})
    guard = gateway.usage.guard  # a store down or locked: 503 within its timeout, never a 500 or a hang
    if not await guard(asyncio.shield(gateway.usage.flush())):  # (a flush cut short would hold the writer)
        raise guard.refused()
    return struct_response(await guard(report(gateway.usage.store, query)))
