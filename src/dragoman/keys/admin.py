"""The Admin API's key operations, in Anthropic's shapes (`/v1/organizations/api_keys`) with
dragoman's additions (tenant, role, limits, models, budget and its use, source).

Reads and writes go to the database (an admin sees every process's changes at once);
a change is applied to this process's keyring as soon as it is written, and reaches the
others at their next poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from dragoman.core.errors import NotFound, PermissionDenied, StoreUnavailable
from dragoman.core.paging import page_of
from dragoman.keys import bodies, money
from dragoman.keys.records import Budget, Grant, KeyRow, digest, hint, key_id, new_secret
from dragoman.keys.ring import Keyring
from dragoman.keys.store import KeyStore
from dragoman.usage.outage import RETRY_AFTER, ReadGuard

OPEN_WAIT = 5.0  # seconds an admin request waits for a store still opening (just started, or the database away)
STATUSES = ("active", "inactive", "archived", "expired")
Spent = Callable[[str, Budget], Awaitable[float | None]]  # (key id, budget) -> nano-dollars this period


class KeyAdmin:
    def __init__(self, ring: Keyring, spent: Spent | None = None) -> None:
        self.ring = ring
        self._spent = spent
        # The database down or locked: 503 with retry-after, logged unless the outage is already.
        self.guard = ReadGuard(None, outage=lambda: ring.outage, store="key")
        self.started_at = time.time()  # configured keys' created_at: when this process read them

    async def _store(self) -> KeyStore:
        """The store, once open: a gateway just started opens it in the background."""
        if self.ring.store is None:
            raise NotFound("keys made at run time are off (admin.api_keys = false, or no admin key is configured)")
        deadline = time.monotonic() + OPEN_WAIT
        while not self.ring.opened:
            if time.monotonic() > deadline:
                raise StoreUnavailable("the key store cannot be reached; try again shortly", retry_after=RETRY_AFTER)
            await asyncio.sleep(0.02)
        return self.ring.store

    async def create(self, body: bytes, actor: str) -> dict[str, Any]:
        store = await self._store()
        request: bodies.Create = bodies.decode(body, bodies.Create)
        values = bodies.checked(msgspec.structs.asdict(request), request.role)
        if values["expires_at"] is not None and values["expires_at"] <= time.time():
            raise bodies.InvalidRequest("expires_at: must be in the future")
        secret = new_secret(request.role)
        now = time.time()
        row = KeyRow(id=key_id(secret), digest=digest(store.salt, secret), hint=hint(secret),
                     name=values["name"].strip(), role=request.role, tenant=values["tenant"], limits=values["limits"],
                     models=values["models"], budget=values["budget"], expires_at=values["expires_at"],
                     created_at=now, created_by=actor, updated_at=now, updated_by=actor)  # fmt: skip
        row = await store.insert(row, actor)
        await self.ring.receive([row])
        return {**await self.describe(row), "key": secret}

    async def update(self, key: str, body: bytes, actor: str) -> dict[str, Any]:
        store = await self._store()
        self._writable(key)
        request: bodies.Update = bodies.decode(body, bodies.Update)
        given = {k: v for k, v in msgspec.structs.asdict(request).items() if v is not msgspec.UNSET}
        current = await store.get(key)
        if current is None:
            raise NotFound(f"api_key_id: no API key {key!r}")
        values = bodies.checked(given, current.role)
        if "name" in values:
            values["name"] = values["name"].strip()
        row = await store.update(key, values, actor)
        if row is None:
            raise NotFound(f"api_key_id: no API key {key!r}")
        await self.ring.receive([row])
        return await self.describe(row)

    async def delete(self, key: str, actor: str) -> dict[str, Any]:
        store = await self._store()
        self._writable(key)
        row = await store.update(key, {"status": "deleted"}, actor, action="delete")
        if row is None:
            raise NotFound(f"api_key_id: no API key {key!r}")
        await self.ring.receive([row])
        return {"id": key, "type": "api_key_deleted"}

    async def retrieve(self, key: str) -> dict[str, Any]:
        grant = self.ring.by_id.get(key)
        if grant is not None and grant.source == "config":
            return self._configured(grant)
        row = await (await self._store()).get(key)
        if row is None:
            raise NotFound(f"api_key_id: no API key {key!r}")
        return await self.describe(row)

    async def page(self, query: Mapping[str, str]) -> dict[str, Any]:
        """Anthropic's paging over keys made here (newest first), then the configured ones."""
        status, tenant = query.get("status"), query.get("tenant") or query.get("workspace_id")
        if status is not None and status not in STATUSES:
            raise bodies.InvalidRequest(f"status: one of {', '.join(STATUSES)}, got {status[:40]!r}")
        now = time.time()
        store = await self._store() if self.ring.store is not None else None
        listed = await store.listed(tenant) if store is not None else []
        ids = [i for i, s, expires in listed if status is None or _status(s, expires, now) == status]
        configured = {g.id: g for g in self.ring.configured() if status in (None, "active")
                      and (tenant is None or g.tenant == tenant)}  # fmt: skip
        ids += sorted(configured)
        page = page_of(ids, query, lambda i: i, "API key")
        rows = await store.by_ids(i for i in page["data"] if i not in configured) if store is not None else {}
        page["data"] = [self._configured(configured[i]) if i in configured else await self.describe(rows[i])
                        for i in page["data"] if i in configured or i in rows]  # fmt: skip
        return page

    def _writable(self, key: str) -> None:
        grant = self.ring.by_id.get(key)
        if grant is not None and grant.source == "config":
            raise PermissionDenied('this key comes from the configuration (source "config"): change it there')

    async def describe(self, row: KeyRow) -> dict[str, Any]:
        budget = None
        if row.budget is not None:
            _, _, end = money.window(row.budget.period, time.time())
            spent = await self._spent(row.id, row.budget) if self._spent is not None else None
            budget = {**msgspec.to_builtins(row.budget), "used": None if spent is None else money.cents(spent),
                      "resets_at": bodies.rfc3339(end)}  # fmt: skip
        return {
            **_common(row.id, row.name, _status(row.status, row.expires_at, time.time()), row.tenant, row.role),
            "partial_key_hint": row.hint,
            "created_at": bodies.rfc3339(row.created_at),
            "created_by": _actor(row.created_by),
            "updated_at": bodies.rfc3339(row.updated_at),
            "updated_by": _actor(row.updated_by),
            "expires_at": bodies.rfc3339(row.expires_at),
            "last_used_at": bodies.rfc3339(row.last_used_at),
            "limits": _limits(row.limits),
            "models": row.models,
            "budget": budget,
            "source": "api",
        }

    def _configured(self, grant: Grant) -> dict[str, Any]:
        return {
            **_common(grant.id, grant.name, "active", grant.tenant, grant.role),
            "partial_key_hint": None, "created_at": bodies.rfc3339(self.started_at), "created_by": None,
            "updated_at": bodies.rfc3339(self.started_at), "updated_by": None, "expires_at": None,
            "last_used_at": None, "limits": None, "models": None, "budget": None, "source": "config",
        }  # fmt: skip


def _common(id_: str, name: str, status: str, tenant: str | None, role: str) -> dict[str, Any]:
    scope = {"type": "workspace", "workspace_id": tenant} if tenant else {"type": "organization"}
    return {"id": id_, "type": "api_key", "name": name, "status": status, "tenant": tenant, "role": role,
            "workspace_id": tenant, "scope": scope, "principal": None}  # fmt: skip


def _actor(key_id: str | None) -> dict[str, str] | None:
    """Who made a change, as Anthropic's `created_by` names an actor (`user` or `service_account`):
    an admin key, no person, is a service account; None where nothing made it (configured keys)."""
    return {"id": key_id, "type": "service_account"} if key_id else None


def _status(status: str, expires_at: float | None, now: float) -> str:
    return "expired" if status == "active" and expires_at is not None and expires_at <= now else status


def _limits(limits: Any) -> dict[str, int] | None:
    if limits is None:
        return None
    return {k: v for k, v in msgspec.to_builtins(limits).items() if v is not None}
