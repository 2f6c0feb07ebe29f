"""The Message Batches routes: thin handlers over `dragoman.batches`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from dragoman import auth
from dragoman.endpoints import _gateway, _read_body
from dragoman.protocol.batches import ENCODER


def _base(request: Request) -> str:
    """The gateway as this client reached it: where it fetches a batch's results."""
    return str(request.base_url).rstrip("/")


def _json(value: object) -> Response:
    return Response(ENCODER.encode(value), media_type="application/json")


async def create(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    body = await _read_body(request, gateway.config.server.max_request_bytes)
    return _json(gateway.batches.create(body, request.headers, _base(request)))


async def list_batches(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    return _json(gateway.batches.page(request.query_params, _base(request)))


async def retrieve(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    return _json(gateway.batches.retrieve(request.path_params["batch_id"], _base(request)))


async def cancel(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    return _json(gateway.batches.cancel(request.path_params["batch_id"], _base(request)))


async def delete(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    return _json(gateway.batches.delete(request.path_params["batch_id"]))


async def results(request: Request) -> Response:
    gateway = _gateway(request)
    auth.check(request, gateway.api_keys)
    return Response(gateway.batches.results(request.path_params["batch_id"]), media_type="application/x-jsonl")
