"""The Message Batches routes: thin handlers over `dragoman.batches.service`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import IO

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from dragoman.core.errors import GatewayError
from dragoman.server.endpoints import _read_body, authorized, caller, owner, struct_response

CHUNK = 1 << 20


def _base(request: Request) -> str:
    """The gateway as this client reached it: where it fetches a batch's results."""
    return str(request.base_url).rstrip("/")


async def create(request: Request) -> Response:
    gateway = authorized(request)
    body = await _read_body(request, gateway.config.server.max_request_bytes)
    who = caller(request, gateway)
    tracing = gateway.pipeline.tracing
    if tracing is None:
        batch = await gateway.batches.create(body, request.headers, _base(request), who.owner, key_id=who.key_id,
                                             tenant=who.tenant)  # fmt: skip
        return struct_response(batch)
    span, traceparent = tracing.batch_created(request.headers, request.scope["path"])
    try:  # the batch's requests each get a trace of their own, linked to this span
        batch = await gateway.batches.create(body, request.headers, _base(request), who.owner, key_id=who.key_id,
                                             tenant=who.tenant, traceparent=traceparent)  # fmt: skip
        span.set_attribute("dragoman.batch.id", batch.id)
        span.set_attribute("http.response.status_code", 200)
    except GatewayError as error:
        span.set_attribute("http.response.status_code", error.status)
        span.set_attribute("error.type", error.type)
        raise
    finally:
        span.end()
    return struct_response(batch)


async def list_batches(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(await gateway.batches.page(request.query_params, owner(request, gateway), _base(request)))


async def retrieve(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(
        gateway.batches.retrieve(request.path_params["batch_id"], owner(request, gateway), _base(request))
    )


async def cancel(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(
        await gateway.batches.cancel(request.path_params["batch_id"], owner(request, gateway), _base(request))
    )


async def delete(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(await gateway.batches.delete(request.path_params["batch_id"], owner(request, gateway)))


async def results(request: Request) -> Response:
    gateway = authorized(request)
    results = gateway.batches.results(request.path_params["batch_id"], owner(request, gateway))
    return StreamingResponse(_chunks(results), media_type="application/x-jsonl")


async def _chunks(results: IO[bytes]) -> AsyncIterator[bytes]:
    """A results file, read in a thread a piece at a time (a batch's results can be large)."""
    try:
        while chunk := await asyncio.to_thread(results.read, CHUNK):
            yield chunk
    finally:
        results.close()
