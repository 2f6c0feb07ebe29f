"""Client authentication: `x-api-key` or `Authorization: Bearer`, as the SDKs send them,
looked up in the gateway's keyring (`keys.ring`: configured keys and keys made at run time)."""

from __future__ import annotations

from starlette.requests import Request

from dragoman.calls.types import Caller
from dragoman.core.errors import PermissionDenied, Unauthorized
from dragoman.core.owners import Owners, legacy
from dragoman.keys.records import Grant, key_id
from dragoman.keys.ring import Keyring

__all__ = ["key_id", "presented_key", "check", "check_admin", "owner", "caller"]


def presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    authorization = request.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return None


def check(request: Request, ring: Keyring) -> Grant | None:
    """Every endpoint but the open ones (`/`, `/health`, `/ready`, `/metrics`) calls this, and
    it asks for a key whatever the path reads as: the route chose the endpoint from the raw
    ASGI path, while `request.url` is rebuilt from the `Host` header, which a client can
    make read as `/` on Starlette before 1.0.1 (CVE-2026-48710). The key must be a client
    key, active and not expired; an admin key manages keys and reads reports only. None:
    the gateway has no keys at all (it is open)."""
    key = presented_key(request)
    grant = ring.lookup(key) if key is not None else None
    if grant is not None and grant.role == "admin":
        raise PermissionDenied("this is an admin key (admin.keys, usage.admin_keys or role admin): it manages keys and "
                               "reads reports; send a client key")  # fmt: skip
    if not ring.required:
        return None
    if key is None:
        raise Unauthorized("x-api-key header is required")
    if len(request.headers.getlist("x-api-key")) > 1:
        raise Unauthorized("x-api-key: the header is sent more than once; send one key")
    if grant is None:
        raise Unauthorized(
            "invalid x-api-key" if request.headers.get("x-api-key") else "invalid API key in the authorization header"
        )
    refusal = grant.refusal()
    if refusal is not None:
        raise Unauthorized(refusal)
    return grant


def check_admin(request: Request, ring: Keyring) -> Grant:
    """The request's key is an active admin key: else 401 (no key, an unknown one) or 403 (a client's)."""
    key = presented_key(request)
    grant = ring.lookup(key) if key is not None else None
    if grant is not None and grant.role == "admin":
        refusal = grant.refusal()
        if refusal is not None:
            raise Unauthorized(refusal)
        return grant
    if not ring.configured_admins() and ring.store is None:
        raise PermissionDenied("this needs an admin key, and none is configured (admin.keys or usage.admin_keys)")
    if key is None:
        raise Unauthorized("x-api-key header is required (an admin key, from admin.keys or usage.admin_keys)")
    if grant is not None:
        raise PermissionDenied("this key may not manage keys or read reports; use an admin key (admin.keys)")
    raise Unauthorized("invalid admin key")


def owner(request: Request, grant: Grant | None, *, shared: bool, owners: Owners | None = None) -> str:
    """Whose files and batches a request may see and makes: a digest of its key's tenant or of
    the key itself (the key is never stored), salted by `owners` (see `core.owners`; without
    it, the plain digest of earlier versions), or "" for everyone when the gateway has no
    keys or `shared` is on. Call with what `check` returned."""
    if shared or grant is None:
        return ""
    basis = f"tenant\0{grant.tenant}" if grant.tenant is not None else f"key\0{presented_key(request) or ''}"
    return owners.of(basis) if owners is not None else legacy(basis)


def caller(request: Request, grant: Grant | None, *, shared: bool, owners: Owners | None = None) -> Caller:
    """Who sent this (authorized) request: its owner, its key's id and its tenant."""
    if grant is None:
        return Caller(owner="")
    return Caller(owner=owner(request, grant, shared=shared, owners=owners), key_id=grant.id, tenant=grant.tenant)
