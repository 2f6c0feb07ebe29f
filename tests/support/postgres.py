"""A real PostgreSQL for tests, never a mock.

`server_url()` is, once per test session: `DATABASE_URL` if set; else the machine's own
server at postgresql://postgres@127.0.0.1:5432/test if it answers; else a throwaway server
started from the `initdb` and `pg_ctl` on PATH in a temporary directory; else the test
fails, naming what is missing. `schema_url(base)` gives each test a schema of its own
(the URL's search_path), dropped afterwards. `PrivatePostgres` is a server a test may stop
and restart (a restart of the shared one would disturb everyone else using it)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.support.servers import free_port

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
_started: list[PrivatePostgres] = []
_url: str | None = None


def answers(url: str, timeout: float = 3.0) -> bool:
    async def probe() -> None:
        connection = await asyncpg.connect(url, timeout=timeout)
        await connection.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    return True


def server_url() -> str:
    """A PostgreSQL server's URL for this session's tests (see the module's docstring)."""
    global _url
    if _url is None:
        if os.environ.get("DATABASE_URL"):
            _url = os.environ["DATABASE_URL"]
        elif answers(DEFAULT_URL):
            _url = DEFAULT_URL
        else:
            server = PrivatePostgres().start()
            atexit.register(server.stop)
            _started.append(server)
            _url = server.url
    return _url


def with_search_path(url: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query) + [("search_path", schema)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


async def _run(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@contextlib.contextmanager
def schema_url(base: str | None = None) -> Iterator[str]:
    """A URL whose tables live in a new schema, dropped (with them) when the block ends."""
    base = base or server_url()
    schema = f"test_{secrets.token_hex(6)}"
    asyncio.run(_run(base, f"CREATE SCHEMA {schema}"))
    try:
        yield with_search_path(base, schema)
    finally:
        asyncio.run(_run(base, f"DROP SCHEMA {schema} CASCADE"))


def count_records(url: str) -> int:
    """Records in the usage table; 0 before the gateway's writer has made it (it opens the
    store in its own task, so requests can be answered first)."""

    async def count() -> int:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return int(await connection.fetchval("SELECT count(*) FROM usage_records"))
        except asyncpg.UndefinedTableError:
            return 0
        finally:
            await connection.close()

    return asyncio.run(count())


class PrivatePostgres:
    """A PostgreSQL server of the test's own, in a temporary directory, on a free port.
    As root, it runs as the `postgres` (or `nobody`) user: PostgreSQL refuses root."""

    def __init__(self) -> None:
        missing = [tool for tool in ("initdb", "pg_ctl") if shutil.which(tool) is None]
        if missing:
            pytest.fail(f"PostgreSQL is needed: no server answers at {DEFAULT_URL}, DATABASE_URL is unset, and "
                        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH to start one "
                        "(install PostgreSQL's server binaries)")  # fmt: skip
        self.directory = Path(tempfile.mkdtemp(prefix="dragoman-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._user = None
        if os.geteuid() == 0:
            self._user = next(u for u in ("postgres", "nobody") if _user_exists(u))
            shutil.chown(self.directory, self._user)

    def _command(self, *args: str) -> list[str]:
        return ["runuser", "-u", self._user, "--", *args] if self._user else list(args)

    def _run(self, *args: str) -> None:
        subprocess.run(self._command(*args), check=True, capture_output=True, timeout=60)

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.directory / "log"), "-w", "start")
        return self

    def stop(self) -> None:
        if self.data.exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """Stop at once (connections dropped, as a crash drops them) and start again."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A schema of the test's own on the session's PostgreSQL."""
    with schema_url() as url:
        yield url


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres().start()
    yield server
    server.remove()


@contextlib.contextmanager
def locked(url: str, *tables: str) -> Iterator[None]:
    """`tables` held in ACCESS EXCLUSIVE mode by another connection (another thread) for the
    block: every statement touching them waits until it ends."""
    held, release = threading.Event(), threading.Event()

    async def hold() -> None:
        connection = await asyncpg.connect(url)
        try:
            async with connection.transaction():
                await connection.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
                held.set()
                await asyncio.to_thread(release.wait, 60)
        finally:
            await connection.close()

    holder = threading.Thread(target=asyncio.run, args=(hold(),))
    holder.start()
    try:
        assert held.wait(30), f"could not lock {tables}"
        yield
    finally:
        release.set()
        holder.join(60)
