"""Client authentication: `x-api-key` or `Authorization: Bearer`, as the SDKs send them."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from starlette.requests import Request

from dragoman.calls.types import Caller
from dragoman.core.errors import PermissionDenied, Unauthorized
from dragoman.core.owners import Owners, legacy


def presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    authorization = request.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return None


def check(request: Request, keys: frozenset[str], admin_keys: frozenset[str] = frozenset()) -> None:
    """Every endpoint but the open ones (`/`, `/health`, `/ready`, `/metrics`) calls this, and
    it asks for a key whatever the path reads as: the route chose the endpoint from the raw
    ASGI path, while `request.url` is rebuilt from the `Host` header, which a client can
    make read as `/` on Starlette before 1.0.1 (CVE-2026-48710). The key must be a client
    key; an admin key (`usage.admin_keys`) reads the usage report only, keys or not."""
    if admin_keys and is_admin(request, admin_keys):
        raise PermissionDenied("this is an admin key (usage.admin_keys): it reads the usage report only")
    if not keys:
        return
    key = presented_key(request)
    if key is None:
        raise Unauthorized("x-api-key header is required")
    if len(request.headers.getlist("x-api-key")) > 1:
        raise Unauthorized("x-api-key: the header is sent more than once; send one key")
    if not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        raise Unauthorized(
            "invalid x-api-key" if request.headers.get("x-api-key") else "invalid API key in the authorization header"
        )


def is_admin(request: Request, admin_keys: frozenset[str]) -> bool:
    key = presented_key(request)
    return key is not None and any(hmac.compare_digest(key.encode(), k.encode()) for k in admin_keys)


def check_admin(request: Request, admin_keys: frozenset[str], keys: frozenset[str]) -> None:
    """The request's key is an admin key: else 401 (no key, an unknown one) or 403 (a client's)."""
    if not admin_keys:
        raise PermissionDenied("the usage report needs an admin key, and none is configured (usage.admin_keys)")
    if is_admin(request, admin_keys):
        return
    key = presented_key(request)
    if key is None:
        raise Unauthorized("x-api-key header is required (an admin key, from usage.admin_keys)")
    if any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        raise PermissionDenied("this key may not read the usage report; use an admin key (usage.admin_keys)")
    raise Unauthorized("invalid admin key")


def owner(request: Request, keys: frozenset[str], *, shared: bool, tenants: Mapping[str, str] | None = None,
          owners: Owners | None = None) -> str:  # fmt: skip
    """Whose files and batches a request may see and makes: a digest of its key's tenant
    (`server.tenants`) or of the key itself (the key is never stored), salted by `owners`
    (see `core.owners`; without it, the plain digest of earlier versions), or "" for
    everyone when no keys are set or `shared` is on. Call after `check`, which has vouched
    for the key."""
    if shared or not keys:
        return ""
    key = presented_key(request) or ""
    tenant = (tenants or {}).get(key)
    basis = f"tenant\0{tenant}" if tenant is not None else f"key\0{key}"
    return owners.of(basis) if owners is not None else legacy(basis)


def key_id(key: str) -> str:
    """A stable name for a key that does not reveal it: for logs, usage and limits."""
    return "key_" + hashlib.sha256(b"dragoman-key\0" + key.encode()).hexdigest()[:24]


def caller(request: Request, keys: frozenset[str], *, shared: bool, tenants: Mapping[str, str] | None = None,
           owners: Owners | None = None) -> Caller:  # fmt: skip
    """Who sent this (authorized) request: its owner, its key's id and its tenant."""
    key = presented_key(request) if keys else None
    tenant = (tenants or {}).get(key) if key is not None else None
    return Caller(owner=owner(request, keys, shared=shared, tenants=tenants, owners=owners),
                  key_id=key_id(key) if key is not None else None, tenant=tenant)  # fmt: skip
