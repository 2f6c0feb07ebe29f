"""`dragoman serve` as a process: several workers on one port, graceful SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.fakes import chunk, text_stream, usage_chunk
from tests.servers import free_port

BODY = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}


def _start(upstream_url: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "dragoman", "serve", "--upstream", upstream_url, "--port", str(port), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "DRAGOMAN_CACHE_DIR": "/nonexistent"},
        start_new_session=True,  # its own process group: killing it takes `--workers` children along
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    _kill(process)
    raise AssertionError(f"dragoman did not start: {process.stderr.read().decode() if process.stderr else ''}")


@pytest.fixture
def stop_later():
    processes: list[subprocess.Popen[bytes]] = []
    yield processes.append
    for process in processes:
        _kill(process)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """The server and any worker processes it started (a SIGKILLed supervisor orphans them)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)


def test_several_workers_serve_one_port(upstream, stop_later):
    process, url = _start(upstream.url, "--workers", "2")
    stop_later(process)
    for _ in range(6):
        response = httpx.post(url + "/v1/messages", json=BODY, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["content"][0]["text"] == "Hello!"


def test_sigterm_lets_a_stream_in_flight_finish(upstream, stop_later):
    slow = [chunk({"role": "assistant", "content": ""}), chunk({"content": "one "}), ("sleep", 1.0),
            chunk({"content": "two"}), chunk({}, "stop"), usage_chunk(5, 2)]  # fmt: skip
    upstream.stream_reply(slow)
    process, url = _start(upstream.url)
    stop_later(process)
    received: list[bytes] = []

    def read_stream() -> None:
        with httpx.stream("POST", url + "/v1/messages", json={**BODY, "stream": True}, timeout=10) as response:
            for data in response.iter_bytes():
                received.append(data)

    reader = threading.Thread(target=read_stream)
    reader.start()
    deadline = time.monotonic() + 5
    while b"one" not in b"".join(received) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    reader.join(10)
    body = b"".join(received)
    assert b"two" in body and body.rstrip().endswith(b'{"type":"message_stop"}')
    assert process.wait(10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
    with pytest.raises(httpx.TransportError):  # no longer accepting
        httpx.post(url + "/v1/messages", json=BODY, timeout=2)


def test_text_stream_sanity(upstream, stop_later):
    upstream.stream_reply(text_stream("a", "b"))
    process, url = _start(upstream.url)
    stop_later(process)
    with httpx.stream("POST", url + "/v1/messages", json={**BODY, "stream": True}, timeout=10) as response:
        assert b"message_stop" in response.read()
