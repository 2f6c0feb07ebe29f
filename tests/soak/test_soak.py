"""A bounded soak: 200 concurrent streams for 30 seconds through the gateway.

Asserts no errors, every stream complete, no streams left in flight, upstream
connections back within the pool, and resident memory flat between the first
and the last part of the run. Loopback only; bounded in time and count.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CONCURRENCY = 200
DURATION = float(os.environ.get("DRAGOMAN_SOAK_SECONDS", "30"))
pytestmark = pytest.mark.soak


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


def _wait_http(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"process exited: {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


async def _load(url: str, stop_at: float, samples: list[float], pid: int) -> tuple[int, int, int]:
    ok = errors = incomplete = 0
    body = {
        "model": "bench-model-paced",
        "max_tokens": 40,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            nonlocal ok, errors, incomplete
            while time.monotonic() < stop_at:
                try:
                    async with session.post(url + "/v1/messages", json=body) as response:
                        data = await response.read()
                    if response.status != 200 or b"event: error" in data:
                        errors += 1
                    elif not data.rstrip().endswith(b'{"type":"message_stop"}'):
                        incomplete += 1
                    else:
                        ok += 1
                except aiohttp.ClientError:
                    errors += 1

        async def sampler() -> None:
            while time.monotonic() < stop_at:
                samples.append(_rss_mb(pid))
                await asyncio.sleep(1)

        await asyncio.gather(sampler(), *(worker() for _ in range(CONCURRENCY)))
    return ok, errors, incomplete


def test_soak_200_streams() -> None:
    upstream_port, gateway_port = free_port(), free_port()
    fake = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "fake_upstream.py"), "--port", str(upstream_port), "--paced-delay-ms", "10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    gateway = subprocess.Popen(
        [sys.executable, "-m", "dragoman", "serve", "--upstream", f"http://127.0.0.1:{upstream_port}/v1",
         "--port", str(gateway_port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "DRAGOMAN_CACHE_DIR": "/nonexistent"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        _wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", fake)
        _wait_http(url + "/health", gateway)
        samples: list[float] = []
        ok, errors, incomplete = asyncio.run(_load(url, time.monotonic() + DURATION, samples, gateway.pid))
        time.sleep(1)
        metrics = httpx.get(url + "/metrics").text
        sockets = _sockets(gateway.pid)
    finally:
        for process in (gateway, fake):
            process.terminate()
        for process in (gateway, fake):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
    assert errors == 0 and incomplete == 0, (ok, errors, incomplete)
    assert ok > CONCURRENCY  # every worker completed streams
    assert "dragoman_streams_in_flight 0.0" in metrics
    # Pooled upstream connections stay open for reuse; nothing beyond the pool leaks.
    assert sockets <= CONCURRENCY + 20, sockets
    # Memory is flat: the last quarter of the run is within 25 MB of the first quarter.
    quarter = max(len(samples) // 4, 1)
    early, late = max(samples[:quarter]), max(samples[-quarter:])
    assert late - early < 25, samples
