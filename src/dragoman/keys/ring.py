"""Every process's own map of keys, the one thing the request path reads: a salted digest
of the presented key, looked up in a dict (the same cost with 3 keys or 100,000).

Configured keys are hashed at start-up under a salt of this process; keys made through the
Admin API under the database's salt, once it is read. A background task asks the database
for its version counter every `admin.poll_interval` seconds and, when it moved, reads only
the rows changed since: a change made on any process is served everywhere within that
interval plus a query (with PostgreSQL, its NOTIFY wakes every process at once; the poll stays,
for a notification lost with its connection). A row replaces what is held only if its version is newer."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from dragoman.keys.records import Grant, KeyRow, digest, key_id
from dragoman.keys.store import KeyStore
from dragoman.usage.outage import Outage

log = logging.getLogger("dragoman.keys")

TOUCH_EVERY = 10.0  # seconds between writes of when keys were last used


class Keyring:
    def __init__(self, clients: Iterable[str] = (), admins: Iterable[str] = (), tenants: Mapping[str, str] | None = None,
                 store: KeyStore | None = None, poll_interval: float = 1.0) -> None:  # fmt: skip
        self._salt = secrets.token_bytes(16)
        self._configured: dict[bytes, Grant] = {}
        self.by_id: dict[str, Grant] = {}  # every key known, configured or not (the limits look them up)
        tenants = tenants or {}
        for key in clients:
            self._add_configured(key, Grant(id=key_id(key), name="configured key", tenant=tenants.get(key),
                                            source="config"))  # fmt: skip
        for key in admins:
            self._add_configured(key, Grant(id=key_id(key), name="configured admin key", role="admin", source="config"))
        self.has_clients = bool(clients)
        self.store = store
        self._interval = poll_interval
        self._api: dict[str, Grant] = {}  # digest (hex, under the database's salt) -> key
        self._digests: dict[str, str] = {}  # id -> its digest, to drop the old entry of a changed key
        self.version = -1  # the database's version read up to (`refresh`); -1: not read yet
        self.used: dict[str, float] = {}  # id -> when last used, not yet written
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.outage = Outage()  # the usage writer's, when both are on (one warning per outage for both)
        self.opened = False  # the store opened (its schema current, its salt read)
        self._woken: asyncio.Event | None = None  # set by PostgreSQL's NOTIFY: read the changes now
        self.listening = False  # told of changes as they commit (PostgreSQL; with SQLite, polling is all there is)
        self.on_budget: Callable[[], None] | None = None  # called once, when a key with a budget is first seen
        self.before_apply: Callable[[list[KeyRow]], Awaitable[None]] | None = None  # budgets seeded (keys.seeding)

    def _add_configured(self, key: str, grant: Grant) -> None:
        self._configured[self._local(key)] = grant
        self.by_id[grant.id] = grant

    def _local(self, key: str) -> bytes:
        return hashlib.blake2b(key.encode(), key=self._salt, digest_size=32).digest()

    @property
    def required(self) -> bool:
        """Whether requests need a key: some client key is configured, or keys are made at run time."""
        return self.has_clients or self.store is not None

    def lookup(self, key: str) -> Grant | None:
        """The key's grant, or None: two digests and two dict lookups, whatever the number of keys
        (none when the gateway has no keys at all)."""
        if not self._configured and not self._api:
            return None
        grant = self._configured.get(self._local(key))
        if grant is None and self._api:
            grant = self._api.get(digest(self.store.salt, key))  # type: ignore[union-attr]
            if grant is not None:
                self.used[grant.id] = time.time()
        return grant

    def configured_admins(self) -> bool:
        return any(g.role == "admin" for g in self._configured.values())

    def configured(self) -> list[Grant]:
        return list(self._configured.values())

    def apply(self, rows: Iterable[KeyRow]) -> None:
        """Rows read from the store (or just written by this process): newer versions only. The
        version read up to moves in `refresh` alone: a row of this process's own, newer than a
        change another made and this one has not read yet, must not hide that change."""
        for row in rows:
            held = self.by_id.get(row.id)
            if held is not None and (held.source == "config" or held.version >= row.version):
                continue
            old = self._digests.pop(row.id, None)
            if old is not None:
                self._api.pop(old, None)
            if row.status == "deleted":
                self.by_id.pop(row.id, None)
                continue
            grant = self.by_id[row.id] = Grant.of(row)
            if grant.budget is not None and self.on_budget is not None:
                self.on_budget()
                self.on_budget = None
            self._api[row.digest] = grant
            self._digests[row.id] = row.digest

    async def receive(self, rows: list[KeyRow]) -> None:
        """`apply`, once `before_apply` has had the rows (it never raises)."""
        if self.before_apply is not None:
            await self.before_apply(rows)
        self.apply(rows)

    async def refresh(self) -> None:
        """Read what changed since the version held (every process, every poll_interval)."""
        assert self.store is not None
        version = await self.store.version()
        if version != self.version:
            await self.receive(await self.store.changes(max(self.version, 0)))
            self.version = max(self.version, version)

    def start(self) -> None:
        if self.store is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="keyring")

    async def _run(self) -> None:
        assert self.store is not None
        touched, self._woken = time.monotonic(), asyncio.Event()
        while True:
            try:
                if not self.opened:
                    await self.store.open()
                    self.opened = True
                self._woken.clear()
                await self.refresh()
                try:
                    await self.store.listen(self._woken.set)
                    self.listening = True
                except Exception:  # noqa: BLE001 - refused or lost: the poll alone finds changes
                    self.listening = False
                if self.used and time.monotonic() - touched > TOUCH_EVERY:
                    used, self.used, touched = self.used, {}, time.monotonic()
                    try:
                        await self.store.touch(used)
                    except BaseException:
                        self.used = {**used, **self.used}  # written at the next try, not lost
                        raise
                if self._failing and self.outage.answered("keys"):
                    log.info("keys: the key store answers again; keys made at run time are current")
                self._failing = False
            except Exception as error:  # noqa: BLE001 - the database away: keys held are served, tried again
                if not self._failing and self.outage.failed("keys"):
                    log.warning("keys: the key store cannot be read (%s: %s); serving the keys held, trying again",
                                type(error).__name__, error)  # fmt: skip
                self._failing = True
            with contextlib.suppress(TimeoutError):  # the poll, unless a NOTIFY comes first
                await asyncio.wait_for(self._woken.wait(), self._interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.store is not None:
            if self.used and self.version >= 0:
                with contextlib.suppress(Exception):
                    await self.store.touch(self.used)
            await self.store.close()
