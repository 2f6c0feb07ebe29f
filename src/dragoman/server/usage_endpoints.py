"""The usage report (Anthropic's Admin API shape), for admin keys only."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from dragoman.core.errors import GatewayError, NotFound
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
    if not await gateway.usage.flush():
        raise GatewayError("the usage store cannot be reached now; try again shortly")
    return struct_response(await report(gateway.usage.store, query))
