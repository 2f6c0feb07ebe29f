"""`dragoman serve` as a child process for the tests: started on a free port, and killed with
any workers it started (the `stop_later` fixture, in tests/conftest.py, does so when a test ends)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from tests.support.servers import start_serving


def _start(upstream_url: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    def start(port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "dragoman", "serve", "--upstream", upstream_url, "--port", str(port), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "DRAGOMAN_CACHE_DIR": "/nonexistent"},
            start_new_session=True,  # its own process group: killing it takes `--workers` children along
        )  # fmt: skip

    def output(process: subprocess.Popen[bytes]) -> str:
        return process.stderr.read().decode() if process.stderr else ""

    return start_serving(start, output, path="/health")


def _kill(process: subprocess.Popen[bytes]) -> None:
    """The server and any worker processes it started (a SIGKILLed supervisor orphans them)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)
