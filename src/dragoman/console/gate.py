"""Who may see what: the console is on only when an admin key exists; a page without a
session redirects to sign-in, a data request without one is a 401; a client key sees only
its own page; a state-changing request needs its session's CSRF token and this origin."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from dragoman.assembly.gateway import Gateway
from dragoman.console.session import COOKIE, CSRF_HEADER, Session, Sessions, same_origin, sessions
from dragoman.core.errors import NotFound, PermissionDenied, Unauthorized
from dragoman.keys.records import Grant

OFF = ("the console is off: it is on once an admin key exists. Add one under [admin] keys (or keys_env) in the "
       "configuration and restart; see docs/console.md")  # fmt: skip


@dataclass(frozen=True)
class Visit:
    """A signed-in request: the gateway, the session, the key's grant and the signer."""

    gateway: Gateway
    session: Session
    grant: Grant
    signer: Sessions

    @property
    def admin(self) -> bool:
        return self.grant.role == "admin"

    @property
    def csrf(self) -> str:
        return self.signer.csrf(self.session)


class SignIn(Exception):
    """A page asked for without a (valid) session: answered with a redirect to sign-in."""


def gateway_of(request: Request) -> Gateway:
    """The gateway the request began on; a 404 saying how to turn the console on when it is off."""
    gateway: Gateway = request.scope["state"].get("gateway") or request.app.state.gateway
    ring = gateway.keyring
    if not (ring.configured_admins() or any(g.role == "admin" for g in ring.by_id.values())):
        raise NotFound(OFF)
    return gateway


async def visit(request: Request, *, page: bool, admin: bool = True) -> Visit:
    """The request's session, checked against the keyring now (a revoked key's session ends)."""
    gateway = gateway_of(request)
    signer = await sessions(gateway)
    session = signer.read(request.cookies.get(COOKIE))
    grant = gateway.keyring.by_id.get(session.k) if session is not None else None
    if session is None or grant is None or grant.role != session.r or grant.refusal() is not None:
        if page:
            raise SignIn()
        raise Unauthorized("no console session: sign in at /console/signin")
    if admin and grant.role != "admin":
        raise PermissionDenied("this view needs an admin key; a client key sees only /console/me")
    return Visit(gateway, session, grant, signer)


async def changing(request: Request, *, admin: bool = True) -> Visit:
    """A state-changing request: signed in, from this origin, with the session's CSRF token."""
    found = await visit(request, page=False, admin=admin)
    if not same_origin(request) or not found.signer.csrf_ok(found.session, request.headers.get(CSRF_HEADER)):
        raise PermissionDenied(f"cross-site request refused: send the page's {CSRF_HEADER} header from this origin")
    return found
