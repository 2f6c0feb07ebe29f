"""Where a tiny request's slowest ones come from, traced in process: GC, own CPU, or waiting.

    python bench/tail_trace.py [--requests 20000] [--usage on|off]

The gateway's ASGI app (default configuration, usage accounting into a temporary
directory) with a backend that answers at once, one request at a time. Each request's
wall time and the main thread's CPU time are recorded, and every garbage collection
(`gc.callbacks`). The slowest 1 % are sorted into: a collection ran during it; its own
CPU (no collection); or waiting (wall time well over its CPU: another thread held the
GIL, or the OS ran something else). No sockets: the network's share is not here.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dragoman.core.config_load import from_dict
from dragoman.server.app import create_app, settle_garbage_collector

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limits_cost  # noqa: E402
import shapes  # noqa: E402

Collections = list[tuple[float, float, float, int]]  # (start, wall, CPU, generation)


def traced() -> Collections:
    found: Collections = []
    began: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began["wall"], began["cpu"] = time.perf_counter(), time.thread_time()
        elif began:
            found.append((began["wall"], time.perf_counter() - began["wall"], time.thread_time() - began["cpu"],
                          info["generation"]))  # fmt: skip

    gc.callbacks.append(callback)
    return found


async def requests(count: int, usage: bool, home: str) -> list[tuple[float, float, float]]:
    data: dict[str, Any] = {"upstreams": {"default": {"url": "http://127.0.0.1:1/v1"}},
                            "models": [{"name": "bench-model", "upstream": "default"}],
                            "usage": {"enabled": usage, "dir": home, "journal_dir": home}}  # fmt: skip
    app = create_app(from_dict(data), backends={"default": limits_cost.Instant()})  # type: ignore[dict-item]
    await app.gateway.discover_all(app.gateway.backends)
    settle_garbage_collector()
    scope, receive = limits_cost.asgi_post(
        shapes.anthropic_body("tiny", model="bench-model", max_tokens=100, stream=False)
    )

    async def send(message: dict[str, Any]) -> None:
        pass

    out = []
    for index in range(count):
        wall, cpu = time.perf_counter(), time.thread_time()
        await app(dict(scope, state={}), receive, send)
        out.append((wall, time.perf_counter() - wall, time.thread_time() - cpu))
        if index % 50 == 0:
            await asyncio.sleep(0)  # the loop's other callbacks run, as a server's would
    await app.gateway.close()
    return out


def report(done: list[tuple[float, float, float]], collections: Collections) -> None:
    walls, cpus = sorted(r[1] for r in done), sorted(r[2] for r in done)

    def q(values: list[float], share: float) -> float:
        return values[int(len(values) * share)] * 1e6

    print(f"{len(done)} requests: wall p50 {q(walls, 0.5):.0f} µs, p99 {q(walls, 0.99):.0f}; "
          f"main thread's CPU p50 {q(cpus, 0.5):.0f}, p99 {q(cpus, 0.99):.0f}")  # fmt: skip
    slow = [r for r in done if r[1] * 1e6 >= q(walls, 0.99)]
    with_gc = [r for r in slow if any(r[0] <= c[0] <= r[0] + r[1] for c in collections)]
    own = [r for r in slow if r not in with_gc and r[2] > 0.7 * r[1]]
    print(f"slowest 1 % ({len(slow)}): a collection in it {len(with_gc)}, its own CPU {len(own)}, "
          f"waiting {len(slow) - len(with_gc) - len(own)}")  # fmt: skip
    for generation in sorted({c[3] for c in collections}):
        these = [c[2] * 1e6 for c in collections if c[3] == generation]
        print(f"generation {generation}: {len(these)} collections ({len(these) / len(done) * 1000:.1f} per 1,000 "
              f"requests), CPU median {statistics.median(these):.0f} µs, max {max(these):.0f} µs")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--usage", choices=("on", "off"), default="on")
    args = parser.parse_args()
    collections = traced()
    with tempfile.TemporaryDirectory(prefix="dragoman-tail-") as home:
        import uvloop

        done = uvloop.run(requests(args.requests, args.usage == "on", home))
    report(done, [c for c in collections if c[0] >= done[0][0]])  # the start-up's own collect left out


if __name__ == "__main__":
    main()
