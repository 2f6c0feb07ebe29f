"""The console's pages (server-rendered with Jinja2) and sign-in/out.

A page carries no data of its own beyond who is signed in: its script reads the view's one
JSON endpoint (`api.py`). The key typed at sign-in travels once, in a POST body; it is never
put in a URL, a page or the cookie (which names the key's id only)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from dragoman.console import gate
from dragoman.console.session import COOKIE, SIGNIN_COOKIE, same_origin, secure, sessions
from dragoman.core.errors import PermissionDenied

SIGNIN = "/console/signin"
MAX_FORM = 16 * 1024
HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "cache-control": "no-store",
    "referrer-policy": "same-origin",  # no-referrer would make the browser send `Origin: null` on our own forms
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
}
_env = jinja2.Environment(loader=jinja2.PackageLoader("dragoman.console", "templates"), autoescape=True)

Endpoint = Callable[[Request], Awaitable[Response]]


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**context), status_code=status, headers=HEADERS)


def view(template: str, title: str, *, admin: bool = True) -> Endpoint:
    """A page's endpoint: its template, for a signed-in key of the right role."""

    async def endpoint(request: Request) -> Response:
        try:
            found = await gate.visit(request, page=True, admin=admin)
        except gate.SignIn:
            return RedirectResponse(SIGNIN, status_code=303)
        except PermissionDenied as refused:
            return render("denied.html", 403, title="Not allowed", message=refused.message, visit=None)
        if not admin and found.admin:  # an admin's own page is the overview
            return RedirectResponse("/console", status_code=303)
        return render(template, title=title, visit=found, path=request.scope["path"])

    return endpoint


def _signin_page(request: Request, status: int = 200, error: str | None = None) -> Response:
    token = secrets.token_urlsafe(24)
    response = render("signin.html", status, title="Sign in", token=token, error=error, visit=None)
    response.set_cookie(SIGNIN_COOKIE, token, max_age=600, path=SIGNIN, httponly=True, samesite="strict",
                        secure=secure(request))  # fmt: skip
    return response


async def signin_form(request: Request) -> Response:
    """The form; a browser already signed in goes on to its first view."""
    try:
        found = await gate.visit(request, page=True, admin=False)
    except gate.SignIn:
        return _signin_page(request)
    return RedirectResponse("/console" if found.admin else "/console/me", status_code=303)


async def signin(request: Request) -> Response:
    """POST /console/signin: the key checked, a session cookie set, the key forgotten."""
    gateway = gate.gateway_of(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM:
        return _signin_page(request, 413, "The form is too large.")
    form = await request.form(max_files=0, max_fields=4)
    token, key = form.get("csrf"), form.get("key")
    cookie = request.cookies.get(SIGNIN_COOKIE)
    if (
        not same_origin(request)
        or not isinstance(token, str)
        or not cookie
        or not secrets.compare_digest(token, cookie)
    ):
        return _signin_page(request, 403, "The sign-in form expired or came from another site; try again.")
    grant = gateway.keyring.lookup(key.strip()) if isinstance(key, str) and key.strip() else None
    if grant is None or grant.refusal() is not None:
        return _signin_page(request, 401, "That key is not valid here, or is no longer active.")
    value, _ = (await sessions(gateway)).issue(grant)
    response = RedirectResponse("/console" if grant.role == "admin" else "/console/me", status_code=303)
    response.set_cookie(COOKIE, value, max_age=int(gateway.config.console.session_hours * 3600), path="/console",
                        httponly=True, samesite="strict", secure=secure(request))  # fmt: skip
    response.delete_cookie(SIGNIN_COOKIE, path=SIGNIN)
    return response


async def signout(request: Request) -> Response:
    """POST /console/signout (CSRF-checked): the cookie cleared."""
    await gate.changing(request, admin=False)
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict", secure=secure(request))
    return response
