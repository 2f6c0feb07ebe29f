"""The Message Batches routes: thin handlers over `dragoman.batches`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from dragoman.endpoints import _read_body, authorized, struct_response


def _base(request: Request) -> str:
    """The gateway as this client reached it: where it fetches a batch's results."""
    return str(request.base_url).rstrip("/")



async def create(request: Request) -> Response:
    gateway = authorized(request)
    body = await _read_body(request, gateway.config.server.max_request_bytes)
    return struct_response(gateway.batches.create(body, request.headers, _base(request)))


async def list_batches(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.batches.page(request.query_params, _base(request)))


async def retrieve(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.batches.retrieve(request.path_params["batch_id"], _base(request)))


async def cancel(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.batches.cancel(request.path_params["batch_id"], _base(request)))


async def delete(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.batches.delete(request.path_params["batch_id"]))


async def results(request: Request) -> Response:
    gateway = authorized(request)
    return Response(gateway.batches.results(request.path_params["batch_id"]), media_type="application/x-jsonl")
