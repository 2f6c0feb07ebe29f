"""`dragoman serve` with a recorder of what happens in the process, for bench/tail_events.py.

    python bench/tail_hook.py OUT.json serve --upstream URL --port N

Before the gateway starts, hooks are set that note, with `time.perf_counter()` (CLOCK_MONOTONIC,
the same clock in every process of the machine):

- `recv`: each read of a client's bytes by the server protocol (the request arriving);
- `app`: each HTTP request's time in the ASGI app, with the main thread's CPU time and
  its run-queue wait (`/proc/thread-self/schedstat`: time runnable but not running, the
  OS running something else) over it;
- `up`: each upstream request, from sending it to its response's head;
- `gc`: each garbage collection, with its generation, CPU time, and whether on the main thread;
  `young`: what the last three collections once serving found (objects by type);
- `jobs`: each job of a thread pool (`asyncio.to_thread` and the like), named, with its
  thread's CPU time.

A request's time in the app that is neither its CPU, nor the upstream's answer, nor a wait
in the run queue is the main thread blocked: on the GIL, while another thread runs.

At exit (SIGTERM: uvicorn drains and returns) they are written to OUT as JSON.
Each hook costs a few µs per request: use the figures to attribute, not to time.
"""

from __future__ import annotations

import concurrent.futures.thread
import functools
import gc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

clock = time.perf_counter
events: dict[str, list[Any]] = {"recv": [], "app": [], "up": [], "gc": [], "jobs": [], "young": []}
_schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)  # the main thread's, bound at open


def run_delay() -> int:
    """ns the main thread has spent runnable but not running, since it started."""
    return int(os.pread(_schedstat, 100, 0).split()[1])


def _kinds(objects: list[Any]) -> list[Any]:
    from collections import Counter

    return [len(objects), Counter(type(o).__qualname__ for o in objects).most_common(10)]


def _gc_hook() -> None:
    began: list[float] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if gc.get_threshold()[0] > 1000:  # the serving process's, not the start-up's: the last three kept
                generation = info["generation"]
                found = [o for g in range(generation + 1) for o in gc.get_objects(g)]
                events["young"][:] = [*events["young"][-2:], [generation, clock(), *_kinds(found)]]
            began[:] = [clock(), time.thread_time()]
        elif began:
            events["gc"].append((began[0], clock(), info["generation"], time.thread_time() - began[1],
                                 threading.get_ident() == MAIN))  # fmt: skip

    gc.callbacks.append(callback)


def _job_hook() -> None:
    run = concurrent.futures.thread._WorkItem.run

    def timed(self: Any) -> None:
        fn = self.fn
        while isinstance(fn, functools.partial):  # to_thread: partial(context.run, func, *args)
            fn = fn.args[0] if fn.func.__name__ == "run" and fn.args else fn.func
        name = getattr(fn, "__qualname__", repr(fn))
        start, cpu = clock(), time.thread_time()
        run(self)
        events["jobs"].append((start, clock(), time.thread_time() - cpu, name))

    concurrent.futures.thread._WorkItem.run = timed  # type: ignore[method-assign]


def _server_hooks() -> None:
    from dragoman.server import app, serving
    from dragoman.upstream.transport import pool

    received = serving.DirectBodyProtocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        events["recv"].append(clock())
        received(self, data)

    serving.DirectBodyProtocol.data_received = data_received  # type: ignore[method-assign]
    called = app.App.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await called(self, scope, receive, send)
        start, cpu, waited = clock(), time.thread_time(), run_delay()
        try:
            await called(self, scope, receive, send)
        finally:
            events["app"].append((start, clock(), time.thread_time() - cpu, (run_delay() - waited) / 1e9))

    app.App.__call__ = call  # type: ignore[method-assign]
    requested = pool.Pool.request

    async def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        start, cpu = clock(), time.thread_time()
        try:
            return await requested(self, *args, **kwargs)
        finally:
            events["up"].append((start, clock(), time.thread_time() - cpu))

    pool.Pool.request = request  # type: ignore[method-assign]


def _write(out: Path) -> None:
    events["threads"] = [t.name for t in threading.enumerate()]
    events["old"] = _kinds(gc.get_objects(2)) + [gc.get_freeze_count()]
    events["switch_interval"] = [sys.getswitchinterval()]
    out.write_bytes(msgspec.json.encode(events))


MAIN = threading.get_ident()

if __name__ == "__main__":
    target = Path(sys.argv[1])
    _gc_hook()
    _job_hook()
    _server_hooks()
    from dragoman.cli import main

    sys.argv = ["dragoman", *sys.argv[2:]]
    try:
        main()
    finally:
        _write(target)
