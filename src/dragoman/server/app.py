"""create_app(config): the routes, the lifespan, and the one error renderer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dragoman.assembly.gateway import Gateway, Timings
from dragoman.assembly.observe import capped, configure_logging
from dragoman.assembly.pipeline import Endpoint
from dragoman.assembly.settings import Settings
from dragoman.backends.shared import Shared
from dragoman.calls.types import Backend, Outcome
from dragoman.console.routes import routes as console_routes
from dragoman.core import ids
from dragoman.core.config import Config
from dragoman.core.errors import GatewayError, MethodNotAllowed, NotFound, Overloaded
from dragoman.server import batch_endpoints, endpoints, file_endpoints, key_endpoints, usage_endpoints
from dragoman.server.access import AccessLogMiddleware
from dragoman.server.disconnect import ClientLeft
from dragoman.server.headers import RequestHeaders
from dragoman.server.lifecycle import Running
from dragoman.server.reload import InFlight, Reloader

log = logging.getLogger("dragoman")

GC_THRESHOLD = 10_000  # allocations between young collections (Python's default: 700)
CONFIG_ENV = "DRAGOMAN_CONFIG_JSON"  # hands the parsed config to `--workers` processes


class RequestIdMiddleware:
    """Gives every request an id, and every response a `request-id` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ids.request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


def error_response(scope: Scope, gateway: Gateway, error: GatewayError, *, with_id: bool = False) -> Response:
    """The one error renderer: Anthropic's envelope; a request's outcome ends with it."""
    state = scope.get("state", {})
    request_id = state.get("request_id")
    outcome = state.get("outcome")
    state["error_type"], state["error_message"] = error.type, error.message  # for the access line (server/access.py)
    if outcome is not None:  # a /v1/messages request that failed before its reply
        outcome.failed(error)
        outcome.finish.end()  # settled before the answer goes out
    headers = error.headers()
    if with_id and request_id:
        headers["request-id"] = request_id
    if outcome is not None and outcome.route:  # the route taken, on a refusal as on an answer
        headers["x-dragoman-route"] = outcome.route
    return Response(error.body(request_id), status_code=error.status, headers=headers, media_type="application/json")


def _error_response(request: Request, error: GatewayError) -> Response:
    return error_response(request.scope, request.app.state.gateway, error)


# The hot endpoints skip Starlette's router and middleware (a few wrappers around
# every `send`, which streams pay per chunk); everything else goes through it.
_HOT: tuple[tuple[str, Endpoint], ...] = (("/messages", "messages"), ("/messages/count_tokens", "count_tokens"))
HOT_PATHS: dict[str, Endpoint] = {
    f"{prefix}{path}": name
    for prefix in ("/v1", "/v1/v1")  # a base URL ending in /v1 makes some clients double it
    for path, name in _HOT
}


def _handled() -> None:
    """A cancellation of the current task answered rather than passed on: the task is no
    longer marked as being cancelled, as what it runs next (an `asyncio.timeout`) expects."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()


class App:
    """The ASGI application: POST /v1/messages and count_tokens directly, the rest via Starlette."""

    def __init__(self, starlette: Starlette, gateway: Gateway) -> None:
        self.starlette = starlette
        self.gateway = gateway
        self.state = starlette.state
        self.in_flight = InFlight()  # by gateway: an old one is closed once its requests have ended
        self.running = Running(gateway)
        self.reloader: Reloader | None = None

    def reload_from(self, load: Callable[[], Config]) -> None:
        """On SIGHUP, swap in the configuration `load` gives (`server.reload`), once serving."""
        self.reloader = Reloader(self, self.running, load)

    def swap(self, gateway: Gateway) -> Gateway:
        """The gateway new requests get; the one they got until now."""
        old, self.gateway = self.gateway, gateway
        self.state.gateway = gateway
        return old

    async def start(self) -> None:
        await self.running.start()
        if self.reloader is not None:
            self.reloader.install()

    async def stop(self) -> None:
        if self.reloader is not None:
            await self.reloader.close()
            self.running = self.reloader.running
        await self.running.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.starlette(scope, receive, send)
            return
        gateway = self.gateway  # the request is served by this one whole, whatever a reload swaps in
        scope.setdefault("state", {})["gateway"] = gateway
        endpoint = HOT_PATHS.get(scope["path"]) if scope["method"] == "POST" else None
        in_flight = self.in_flight
        in_flight.begin(gateway)
        try:
            if endpoint is None:
                await self.starlette(scope, receive, send)
                return
            scope["state"]["request_id"] = request_id = ids.request_id()
            outcome = gateway.metrics.outcome(request_id, endpoint)
            with outcome.finish:  # however it ends, what it held is released and it is recorded, once
                await self._answer(gateway, scope, receive, send, endpoint, outcome)
        finally:
            in_flight.end(gateway)

    async def _answer(self, gateway: Gateway, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint,
                      outcome: Outcome) -> None:  # fmt: skip
        request_id = outcome.request_id
        try:
            request = Request(scope, receive)
            request._headers = RequestHeaders(scope)  # read by `request.headers` (Starlette's Request caches it there)
            response = await endpoints.serve(gateway, request, endpoint, outcome)
        except ClientLeft:  # gone while sending its request: nobody to answer
            outcome.left()
            return
        except GatewayError as error:
            response = error_response(scope, gateway, error, with_id=True)
        except asyncio.CancelledError:
            # The server is stopping and this request outlived the grace period (a client that
            # left is answered 499 by `serve`): an error the SDKs retry, as a stream gets, not
            # uvicorn's plain-text 500.
            _handled()
            stopping = Overloaded("the server is shutting down; send the request again")
            response = error_response(scope, gateway, stopping, with_id=True)
            try:
                with contextlib.suppress(Exception):  # the client gone, or the second passed: nothing more to do
                    async with asyncio.timeout(1):
                        await response(scope, receive, send)
            except asyncio.CancelledError:  # cancelled again while answering: the answer is given up
                _handled()
            return
        except Exception as exc:
            log.exception("unhandled error on POST %s", capped(scope["path"]), exc_info=exc)
            response = error_response(scope, gateway, GatewayError("internal error in the gateway"), with_id=True)
        if not isinstance(response, endpoints.HOT_RESPONSES) and "request-id" not in response.headers:
            response.headers["request-id"] = request_id
        await response(scope, receive, send)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _error_response(request, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: GatewayError = MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
    elif exc.status_code == 404:
        error = NotFound(f"no endpoint at {request.method} {request.url.path}")
    else:
        error = GatewayError(str(exc.detail))
        error.status = exc.status_code  # type: ignore[misc]
    return _error_response(request, error)


async def _client_left(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # gone while sending its body: nobody to answer, nothing broke


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, capped(request.url.path), exc_info=exc)
    return _error_response(request, GatewayError("internal error in the gateway"))


EXCEPTION_HANDLERS = {
    GatewayError: _gateway_error,
    HTTPException: _http_error,
    ClientLeft: _client_left,
    ClientDisconnect: _client_left,
    Exception: _unexpected,
}


def _routes() -> list[BaseRoute]:
    """Each route is named as the access log names its endpoint (server/access.py)."""
    routes: list[BaseRoute] = [
        Route("/", endpoints.root, methods=["GET", "HEAD"], name="root"),
        Route("/api/hello", endpoints.root, methods=["GET", "HEAD"], name="root"),  # Claude Code's connection warm-up
        Route("/health", endpoints.health, methods=["GET"]),
        Route("/ready", endpoints.ready, methods=["GET"]),
        Route("/metrics", endpoints.metrics, methods=["GET"]),
        *console_routes(),  # the operator console (/console), on when an admin key exists
    ]
    # A base URL that already ends in /v1 makes some clients ask for /v1/v1/messages.
    for prefix in ("/v1", "/v1/v1"):
        routes += [
            # POST is served by App directly; these answer other methods with a 405.
            Route(f"{prefix}/messages", endpoints.messages, methods=["POST"], name="messages"),
            Route(f"{prefix}/messages/count_tokens", endpoints.count_tokens, methods=["POST"], name="count_tokens"),
            Route(f"{prefix}/models", endpoints.list_models, methods=["GET"], name="models"),
            Route(prefix + "/models/{model_id:path}", endpoints.get_model, methods=["GET"], name="model"),
            Route(f"{prefix}/messages/batches", batch_endpoints.create, methods=["POST"], name="batches.create"),
            Route(f"{prefix}/messages/batches", batch_endpoints.list_batches, methods=["GET"], name="batches.list"),
            Route(prefix + "/messages/batches/{batch_id}", batch_endpoints.retrieve, methods=["GET"], name="batches.retrieve"),
            Route(prefix + "/messages/batches/{batch_id}", batch_endpoints.delete, methods=["DELETE"], name="batches.delete"),
            Route(prefix + "/messages/batches/{batch_id}/cancel", batch_endpoints.cancel, methods=["POST"], name="batches.cancel"),
            Route(prefix + "/messages/batches/{batch_id}/results", batch_endpoints.results, methods=["GET"], name="batches.results"),
            Route(f"{prefix}/files", file_endpoints.upload, methods=["POST"], name="files.upload"),
            Route(f"{prefix}/files", file_endpoints.list_files, methods=["GET"], name="files.list"),
            Route(prefix + "/files/{file_id}", file_endpoints.retrieve, methods=["GET"], name="files.retrieve"),
            Route(prefix + "/files/{file_id}", file_endpoints.delete, methods=["DELETE"], name="files.delete"),
            Route(prefix + "/files/{file_id}/content", file_endpoints.download, methods=["GET"], name="files.content"),
            Route(f"{prefix}/organizations/usage_report/messages", usage_endpoints.messages_report, methods=["GET"],
                  name="usage_report"),
            *key_endpoints.routes(prefix),
        ]  # fmt: skip
    return routes


def settle_garbage_collector() -> None:
    """For a serving process, once its app is built. Objects made at start-up live as long
    as the process: `freeze` moves them out of the collector's sight. A higher first
    threshold makes young collections rarer: a request allocates a burst of short-lived
    objects, most freed before any collection. (12% of CPU samples were collections on
    paced streams at c=32 before this and untracked wire types; about 3% after.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


# Libraries that log pieces of what clients send (a PDF's objects, a form's bytes): their
# warnings would put client data in the gateway's log, even whole forged log lines.
QUIET_LOGGERS = ("pypdf", "multipart", "python_multipart")


def create_app(config: Config, *, backends: dict[str, Backend] | None = None, settings: Settings | None = None,
               timings: Timings | None = None, shared: Shared | None = None) -> App:  # fmt: skip
    """The app serving `config` (`settings`: resolved already, else resolved here: a ConfigError
    listing every problem; `timings` and `shared`: a test's)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    gateway = Gateway(config, backends, shared=shared, settings=settings, timings=timings)

    @contextlib.asynccontextmanager
    async def lifespan(starlette: Starlette) -> AsyncIterator[None]:
        app: App = starlette.state.app
        await app.start()
        try:
            yield
        finally:
            await app.stop()

    app = Starlette(
        routes=_routes(),
        lifespan=lifespan,
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.router.redirect_slashes = False  # POST /v1/messages/ is an unknown path (404 envelope), not a bodiless redirect
    app.state.gateway = gateway
    app.add_middleware(AccessLogMiddleware)  # inside RequestIdMiddleware: the last added runs first
    app.add_middleware(RequestIdMiddleware)
    app.state.app = App(app, gateway)
    return app.state.app  # type: ignore[no-any-return]


def app_from_environment() -> App:
    """The app for a worker process started by `dragoman serve --workers N`."""
    import msgspec

    config = msgspec.json.decode(os.environ[CONFIG_ENV], type=Config)
    configure_logging(config.server.log_level)
    app = create_app(config)
    settle_garbage_collector()
    return app
