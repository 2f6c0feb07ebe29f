"""The access line of every request the Messages endpoints do not log themselves.

`/v1/messages` and `count_tokens` write theirs with model, upstream and usage
(assembly/observe.py); this writes one for the rest a client does: the model list,
Claude Code's `HEAD /`, Batches, Files, and requests for no endpoint at all, so that
an operator sees everything a client did. The infrastructure's probes (`/health`,
`/ready`, `/metrics`) would drown them and get none. Ids from the path are logged;
bodies, queries and keys never are.
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dragoman.assembly.observe import json_line, log, logged_message
from dragoman.core.redaction import NO_KEYS
from dragoman.server.auth import presented_key

PROBES = frozenset({"/health", "/ready", "/metrics"})
IDS = ("model_id", "batch_id", "file_id")  # path parameters worth a field of their own


class AccessLogMiddleware:
    """Inside RequestIdMiddleware (it reads the request id), around Starlette's routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBES or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        except BaseException:
            status = status or 500  # a bug the outer handler answers, or the server stopping
            raise
        finally:
            log.info(json_line(_fields(scope, status or 499, time.perf_counter() - started)))


def _fields(scope: Scope, status: int, duration: float) -> dict[str, object]:
    state = scope.get("state", {})
    route = scope.get("route")
    gateway = getattr(getattr(scope.get("app"), "state", None), "gateway", None)
    params = scope.get("path_params", {})
    fields: dict[str, object] = {
        "request_id": state.get("request_id"),
        "endpoint": getattr(route, "name", None) if route is not None else "unknown",
        "method": scope["method"],
        "url_path": None if route is not None else scope["path"],  # capped by json_line
        "status": status,
        "duration_ms": round(duration * 1000, 1),
        "error": state.get("error_type"),
        "error_message": logged_message(state.get("error_message"), gateway.metrics.redactor if gateway else NO_KEYS),
        "client_disconnected": True if status == 499 else None,
    }
    fields.update({key: str(params[key]) for key in IDS if key in params})
    fields.update(_key_fields(scope))
    return fields


def _key_fields(scope: Scope) -> dict[str, object]:
    """The key's id and tenant, as the Messages endpoints' lines name them: only for a key the
    gateway knows (an unknown one is no one's; the key itself is never logged)."""
    app = scope.get("app")
    gateway = getattr(getattr(app, "state", None), "gateway", None)
    grant = scope.get("state", {}).get("grant")
    if grant is None and gateway is not None:  # an admin endpoint, or one that refused the key
        key = presented_key(Request(scope))
        grant = gateway.keyring.lookup(key) if key is not None else None
    fields: dict[str, object] = {} if grant is None else {"key_id": grant.id, "tenant": grant.tenant}
    fields.update(scope.get("state", {}).get("admin", {}))  # what an Admin API request changed
    return fields
