"""Real Redis for the tests: the one at REDIS_URL, else 127.0.0.1:6379 if it answers,
else a `redis-server` from PATH started on a free port; else a failure naming what is
missing. Each test gets a key prefix of its own (`prefix`), its keys deleted after it.
`RedisProcess` is a private server a test may kill and start again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.servers import free_port

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


class RedisProcess:
    """A `redis-server` of the test's own on a loopback port, without persistence."""

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("these tests need Redis: set REDIS_URL, run one on 127.0.0.1:6379, or put redis-server on PATH "
                        "(Debian: apt-get install redis-server)")  # fmt: skip
        self.binary = binary
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="dragoman-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _answers(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def server_url() -> Iterator[str]:
    """A URL where Redis answers, for as long as the block runs."""
    url = os.environ.get("REDIS_URL")
    if url:
        if not _answers(url):
            pytest.fail(f"REDIS_URL is set but Redis does not answer there: {url}")
        yield url
    elif _answers(DEFAULT_URL):
        yield DEFAULT_URL
    else:
        own = RedisProcess().start()
        try:
            yield own.url
        finally:
            own.stop()


@contextlib.contextmanager
def prefix(url: str) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards."""
    name = f"dragoman-test:{uuid.uuid4().hex[:12]}:"
    try:
        yield name
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
            keys = list(client.scan_iter(match=name + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
