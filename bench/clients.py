"""Which HTTP client to call upstreams with, measured: aiohttp, httpx, and dragoman's
own (dragoman.upstream.client on asyncio Protocols with httptools, the one it uses).

Starts the fake upstream, then drives it with each client as dragoman would (one
pooled client, a small JSON POST to /v1/chat/completions, the body read whole),
at concurrency 1 and 32, and prints requests per second and client CPU per request.
dragoman's client is measured through HttpClient.post, retries and timeouts included.

    python bench/clients.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

HERE = Path(__file__).resolve().parent
BODY = b'{"model":"bench-model","max_tokens":100,"messages":[{"role":"user","content":"Say hello."}]}'
HEADERS = {"content-type": "application/json"}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _drive(call: Callable[[], Awaitable[None]], concurrency: int, seconds: float) -> tuple[float, float]:
    for _ in range(20):  # warm the pool
        await call()
    count = 0
    stop = time.monotonic() + seconds
    cpu, start = _cpu(), time.monotonic()

    async def worker() -> None:
        nonlocal count
        while time.monotonic() < stop:
            await call()
            count += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, spent = time.monotonic() - start, _cpu() - cpu
    return count / elapsed, spent / count * 1e6


async def _aiohttp(url: str, concurrency: int, seconds: float) -> tuple[float, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def call() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                await response.read()

        return await _drive(call, concurrency, seconds)


async def _httpx(url: str, concurrency: int, seconds: float) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:

        async def call() -> None:
            response = await client.post(url, content=BODY, headers=HEADERS)
            response.read()

        return await _drive(call, concurrency, seconds)


async def _dragoman(url: str, concurrency: int, seconds: float) -> tuple[float, float]:
    from dragoman.core.config_load import from_dict
    from dragoman.upstream.client import HttpClient

    upstream = from_dict({"upstreams": {"fake": {"url": url.removesuffix("/chat/completions")}}}).upstreams["fake"]
    client = HttpClient("fake", upstream, None, prefix="/v1")

    async def call() -> None:
        response = await client.post("/chat/completions", BODY)
        await response.read()
        response.release()

    try:
        return await _drive(call, concurrency, seconds)
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    fake = subprocess.Popen(
        [sys.executable, str(HERE / "fake_upstream.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        print(
            f"{'client':8} {'conc':>4} {'req/s':>8} {'CPU µs/req':>11}   (python {sys.version.split()[0]}, pid {os.getpid()})"
        )
        for name, run in (("aiohttp", _aiohttp), ("httpx", _httpx), ("dragoman", _dragoman)):
            for concurrency in (1, 32):
                rate, cpu = asyncio.run(run(url, concurrency, args.seconds))
                print(f"{name:8} {concurrency:>4} {rate:>8.0f} {cpu:>11.0f}")
    finally:
        fake.terminate()
        fake.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
