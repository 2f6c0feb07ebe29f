"""Console sessions: a signed cookie naming the key that signed in, never the key itself.

The signing secret is shared by every replica, so a session made on one is read on all:
`[console] session_secret_env` when set; else one made once and kept in the keys' database
(the SQLite file beside the usage records, or PostgreSQL), the first process to ask writing
it and every later one reading it. Every request checks the key again in the keyring, so a
revoked or expired key ends its sessions on the next click. CSRF: every state-changing
request carries a token derived from its session (sign-in: a double-submit cookie) and,
when the browser sends one, an Origin of this host."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import time
import weakref
from typing import Literal

import msgspec
from starlette.requests import Request

from dragoman.assembly.gateway import Gateway
from dragoman.core.errors import GatewayError
from dragoman.keys.records import Grant
from dragoman.keys.store import MIGRATION_LOCK

COOKIE = "dragoman_console"
SIGNIN_COOKIE = "dragoman_console_signin"  # the sign-in form's double-submit token
CSRF_HEADER = "x-csrf-token"
OPEN_WAIT = 5.0  # seconds to wait for a key store still opening
_TABLE = "dragoman_console_state"


class Unavailable(GatewayError):
    status = 503


class Session(msgspec.Struct, frozen=True):
    k: str  # the key's id
    r: Literal["client", "admin"]  # its role when it signed in
    e: float  # expires at (epoch seconds)
    n: str  # a nonce: the session's own CSRF token is derived from it


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Issues and reads session cookies under one secret."""

    def __init__(self, secret: bytes, hours: float) -> None:
        self._secret = secret
        self.lifetime = hours * 3600

    def _mac(self, label: bytes, data: bytes) -> bytes:
        return hmac.new(self._secret, label + b"\0" + data, hashlib.sha256).digest()

    def issue(self, grant: Grant) -> tuple[str, Session]:
        session = Session(k=grant.id, r=grant.role, e=time.time() + self.lifetime, n=secrets.token_urlsafe(16))
        payload = msgspec.json.encode(session)
        return f"{_b64(payload)}.{_b64(self._mac(b'session', payload))}", session

    def read(self, value: str | None) -> Session | None:
        """The session the cookie holds, if it is ours (signature) and has not expired."""
        if not value or value.count(".") != 1 or len(value) > 1024:
            return None
        body, mac = value.split(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except ValueError:
            return None
        if not hmac.compare_digest(given, self._mac(b"session", payload)):
            return None
        try:
            session = msgspec.json.decode(payload, type=Session)
        except msgspec.DecodeError:
            return None
        return session if session.e > time.time() else None

    def csrf(self, session: Session) -> str:
        return _b64(self._mac(b"csrf", session.n.encode()))

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(token.encode(), self.csrf(session).encode())  # type: ignore[union-attr]


def same_origin(request: Request) -> bool:
    """Whether the request comes from our own pages. A browser says where a request comes from
    (`Sec-Fetch-Site`, and `Origin` on a POST): a forged cross-site form or fetch names the
    other site and is refused. A client sending neither (a script with the token) passes."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or (origin == "null" and site is not None):
        return True
    host = request.headers.get("host", "")
    return bool(host) and origin.partition("://")[2] == host


def secure(request: Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a proxy saying so (uvicorn
    applies a trusted proxy's X-Forwarded-Proto to the scheme; a client sending the header
    itself only makes its own cookie TLS-only)."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


_sessions: weakref.WeakKeyDictionary[Gateway, Sessions] = weakref.WeakKeyDictionary()


async def sessions(gateway: Gateway) -> Sessions:
    """The gateway's session signer, its secret found once (see the module's docstring)."""
    found = _sessions.get(gateway)
    if found is None:  # two first requests racing both read the one secret the database keeps
        found = _sessions[gateway] = Sessions(await _secret(gateway), gateway.config.console.session_hours)
    return found


async def _secret(gateway: Gateway) -> bytes:
    variable = gateway.config.console.session_secret_env
    if variable:
        value = os.environ.get(variable, "")
        if len(value) < 16:
            raise Unavailable(f"console.session_secret_env: the variable {variable} must hold at least 16 characters")
        return hashlib.sha256(b"dragoman-console\0" + value.encode()).digest()
    ring = gateway.keyring
    if ring.store is None:  # admin keys from the configuration only: every replica has the same ones
        basis = "\0".join(sorted(gateway.admin_keys)).encode()  # resolved once (assembly.settings)
        return hashlib.sha256(b"dragoman-console-configured\0" + basis).digest()
    deadline = time.monotonic() + OPEN_WAIT
    while not ring.opened:
        if time.monotonic() > deadline:
            raise Unavailable("the key store cannot be reached; try again shortly", should_retry=True)
        await asyncio.sleep(0.02)
    async with ring.store.db.transaction() as conn:
        if ring.store.db.dialect == "postgres":  # one process at a time creates the table
            await conn.execute("SELECT pg_advisory_xact_lock(?)", MIGRATION_LOCK)
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (id INTEGER PRIMARY KEY, secret TEXT NOT NULL)")
        await conn.execute(f"INSERT INTO {_TABLE} (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
                           secrets.token_hex(32))  # fmt: skip
        return bytes.fromhex((await conn.fetch(f"SELECT secret FROM {_TABLE} WHERE id = 1"))[0][0])
