"""`dragoman serve` as a child process for the tests: started on a free port, and killed with
any workers it started (the `stop_later` fixture, in tests/conftest.py, does so when a test ends)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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


class Stderr:
    """What a `dragoman serve` process writes to stderr, read as it comes (by a thread of its own:
    the process is then waited for with `wait`, not `communicate`)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._stream = process.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            with self._changed:
                self.lines.append(line.decode(errors="replace"))
                self._changed.notify_all()

    def wait_for(self, text: str, *, count: int = 1, timeout: float = 30) -> list[str]:
        """The lines holding `text`, once there are `count` of them."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.having(text)) >= count, timeout)
            found = self.having(text)
        assert len(found) >= count, f"no {text!r} within {timeout} s:\n{''.join(self.lines)}"
        return found

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


class Prober:
    """Opens a TCP connection to a port again and again, in a thread, until stopped: the
    connections refused tell whether the port ever stopped accepting."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _probe(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5):
                    self.accepted += 1
            except OSError as error:
                self.refused.append(repr(error))
            time.sleep(0.005)  # a bounded rate, not a synchronisation
