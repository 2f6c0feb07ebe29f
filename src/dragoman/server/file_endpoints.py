"""The Files API routes: thin handlers over `dragoman.files.store`. Each sees only the files
of the caller's key (see `endpoints.owner`)."""

from __future__ import annotations

from contextlib import aclosing

from python_multipart.multipart import parse_options_header
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from dragoman.core.errors import InvalidRequest, RequestTooLarge
from dragoman.files.store import EXPIRES_IN
from dragoman.server.endpoints import authorized, owner, struct_response

MULTIPART_OVERHEAD = 64 * 1024  # the form's own bytes around the file


async def upload(request: Request) -> Response:
    gateway = authorized(request)
    store = gateway.files
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > store.max_bytes + MULTIPART_OVERHEAD:
        raise RequestTooLarge(f"file: the upload is {declared} bytes; files may have at most {store.max_bytes} bytes")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("file: upload the file as multipart/form-data, in a part named `file`")
    limit = store.max_bytes + MULTIPART_OVERHEAD
    try:
        async with aclosing(Request(request.scope, _bounded(request.receive, limit)).stream()) as body:
            form = await _UploadParser(
                request.headers, body, max_files=1, max_fields=8, max_part_size=1024 * 1024
            ).parse()
    except MultiPartException as error:  # a multipart body Starlette's parser cannot read
        raise InvalidRequest(f"file: the multipart body cannot be read ({error.message})") from None
    try:
        part = form.get("file")
        if not isinstance(part, UploadFile):
            raise InvalidRequest("file: a part named `file` holding the file is needed")
        data = await part.read(store.max_bytes + 1)
        if len(data) > store.max_bytes:
            raise RequestTooLarge(f"file: files may have at most {store.max_bytes} bytes")
        meta = await store.save(
            part.filename or "",
            part.content_type or "application/octet-stream",
            data,
            owner=owner(request, gateway),
            expires_in=_expires_in(form.get("expires_in_seconds")),
        )
    finally:
        await form.close()  # the spooled temporary file
    return struct_response(meta)


class _UploadParser(MultiPartParser):
    """Starlette's multipart parser, reading a typed `file` part as a file even without a
    `filename`: the TypeScript SDK sends a Blob, or a file made with toFile(bytes) and no
    name, with a Content-Type and no filename (undici writes none for an empty name).
    Anthropic names such an upload `unnamed` (the SDK's FileUploadParams); read as a form
    field it was a 400 here. A part without a Content-Type stays a plain field.

    It reads the parser's current part, which is Starlette's own state: should a release
    move it, such uploads are refused again as before (never a 500), and the upload test
    of a part without a filename fails to say so."""

    def on_headers_finished(self) -> None:
        part = getattr(self, "_current_part", None)
        disposition = getattr(part, "content_disposition", None)
        if isinstance(disposition, bytes):
            _, options = parse_options_header(disposition)
            typed = any(
                name == b"content-type" for name, _ in getattr(part, "item_headers", ())
            )  # a plain field has no type
            if options.get(b"name") == b"file" and b"filename" not in options and typed:
                part.content_disposition = disposition + b'; filename=""'  # type: ignore[union-attr]
        super().on_headers_finished()


def _expires_in(field: object) -> int | None:
    """The upload's `expires_in_seconds` form field, checked: a file the client asked to
    expire must never be kept for good without a word."""
    if field is None:
        return None
    low, high = EXPIRES_IN
    # isdecimal, not isdigit: "3600²" is digits to isdigit and no number to int()
    if not isinstance(field, str) or not field.strip().isdecimal() or not low <= int(field) <= high:
        raise InvalidRequest(f"expires_in_seconds: an integer from {low} to {high} (1 hour to 90 days), got {field!r}")
    return int(field)


def _bounded(receive: Receive, limit: int) -> Receive:
    """`receive`, refusing a body past `limit` bytes as it arrives: a chunked upload
    declares no length, and the form parser would spool it all to disk first."""
    received = 0

    async def bounded() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise RequestTooLarge(
                    f"file: the upload passes {limit} bytes; files may have at most {limit - MULTIPART_OVERHEAD} bytes"
                )
        return message

    return bounded


async def list_files(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(await gateway.files.page(request.query_params, owner=owner(request, gateway)))


async def retrieve(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.files.metadata(request.path_params["file_id"], owner=owner(request, gateway)))


async def download(request: Request) -> Response:
    gateway = authorized(request)
    meta = gateway.files.metadata(request.path_params["file_id"], owner=owner(request, gateway))  # 404 first
    raise InvalidRequest(f"file_id: {meta.id} was uploaded, and uploaded files cannot be downloaded (as on Anthropic)",
                         error_code="file_not_downloadable")  # fmt: skip


async def delete(request: Request) -> Response:
    gateway = authorized(request)
    return struct_response(gateway.files.delete(request.path_params["file_id"], owner=owner(request, gateway)))
