"""Closed-loop load generator: fixed concurrency, bounded by time and by count.

Each of `concurrency` workers sends one request, waits for the whole reply, and
sends the next, until the window closes or the request budget is spent.
Statistics cover a steady-state window after a warm-up (see `run_load`): the
replies that finished inside it; replies still running when it closes are
awaited (so the server is idle when the next measurement starts) but not counted. The gateway's CPU
seconds and resident memory are read from /proc at the window's edges, summed
over the process and its children.

Streams (`stream=True`) are read as they arrive: time to first token is the
arrival of the first text delta (`content_block_delta` for Anthropic streams,
`"delta":{"content":` for OpenAI ones), time to last byte the end of the body.
A reply counts as failed on a non-200 status, a body that is not a message, a
stream without its final event (`message_stop` or `[DONE]`), or one with an
`error` event. An Anthropic reply that passes is also compared with Anthropic's
format where a gateway may differ and a client still gets its text (`DIFFERENCES`):
each difference is counted, per kind, over the replies in the window, not failed.

CLI: python bench/load.py --url http://127.0.0.1:8765/v1/messages --shape tiny \
         --concurrency 32 --duration 5 [--stream] [--tokens 100] [--pid PID]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# -- /proc ---------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as file:
                out.extend(int(c) for c in file.read().split())
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo.extend(_children(current))
    return pids


def cpu_seconds(pid: int) -> float:
    """CPU time of the process and its live children, in seconds: the scheduler's
    nanosecond run time of each thread (/proc/PID/task/TID/schedstat), else utime +
    stime in clock ticks (10 ms steps: too coarse for a few dozen slow requests)."""
    total = 0.0
    for p in process_tree(pid):
        total += _run_time(p)
    return total


def _run_time(pid: int) -> float:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        nanoseconds = 0
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                nanoseconds += int(file.read().split()[0])
        return nanoseconds / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)


def sleeps(pid: int) -> int:
    """Times the process and its live children gave up the CPU to wait (voluntary context
    switches of every thread): how often the event loop found nothing ready and slept."""
    total = 0
    for p in process_tree(pid):
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/status") as file:
                    for line in file:
                        if line.startswith("voluntary_ctxt_switches:"):
                            total += int(line.split()[1])
                            break
        except (OSError, ValueError):
            continue
    return total


def rss_bytes(pid: int) -> int:
    """VmRSS of the process and its live children."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as file:
                for line in file:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- results -------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


@dataclass
class Result:
    requests: int = 0  # counted in the window
    errors: int = 0  # anywhere in the run
    first_error: str | None = None
    window: float = 0.0
    latency: list[float] = field(default_factory=list)  # seconds; time to last byte for streams
    ttft: list[float] = field(default_factory=list)
    deltas: int = 0  # text chunks in the window (streams): `run_load`'s `chunks` per reply, else the deltas received
    # replies in the window that passed but differ from Anthropic's format, by kind (DIFFERENCES)
    differences: dict[str, int] = field(default_factory=dict)
    cpu: float | None = None  # server CPU seconds in the window
    sleeps: int | None = None  # the server's waits in the window (`sleeps`)
    rss_before: int | None = None
    rss_after: int | None = None
    upstream_cpu: float | None = None
    client_cpu: float = 0.0

    @property
    def throughput(self) -> float:
        return self.requests / self.window if self.window > 0 else 0.0

    def ms(self, p: float, ttft: bool = False) -> float:
        return percentile(self.ttft if ttft else self.latency, p) * 1000

    @property
    def sleeps_per_request(self) -> float | None:
        return self.sleeps / self.requests if self.sleeps is not None and self.requests else None

    @property
    def cpu_per_request_ms(self) -> float | None:
        return self.cpu / self.requests * 1000 if self.cpu is not None and self.requests else None

    @property
    def cpu_per_delta_us(self) -> float | None:
        return self.cpu / self.deltas * 1e6 if self.cpu is not None and self.deltas else None

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "errors": self.errors,
            "window_s": round(self.window, 3),
            "throughput_rps": round(self.throughput, 1),
            "p50_ms": round(self.ms(50), 3),
            "p90_ms": round(self.ms(90), 3),
            "p99_ms": round(self.ms(99), 3),
            "client_cpu_s": round(self.client_cpu, 2),
        }
        if self.ttft:
            out.update(
                ttft_p50_ms=round(self.ms(50, True), 3), ttft_p99_ms=round(self.ms(99, True), 3), deltas=self.deltas
            )
        if self.cpu is not None:
            out["server_cpu_s"] = round(self.cpu, 3)
            out["cpu_ms_per_request"] = round(self.cpu_per_request_ms or 0, 4)
            if self.deltas:
                out["cpu_us_per_delta"] = round(self.cpu_per_delta_us or 0, 2)
        if self.rss_after is not None:
            out["rss_mb"] = round(self.rss_after / 2**20, 1)
        if self.upstream_cpu is not None:
            out["upstream_cpu_s"] = round(self.upstream_cpu, 3)
        if self.differences:
            out["differences"] = dict(self.differences)
        if self.first_error:
            out["first_error"] = self.first_error
        return out


# -- the load ------------------------------------------------------------------------


class _Message(msgspec.Struct):
    """Enough of a non-streamed reply to tell a message from an error."""

    type: str | None = None
    object: str | None = None
    content: Any = None
    choices: Any = None
    id: Any = None


class _Usage(msgspec.Struct):
    input_tokens: Any = None


class _Started(msgspec.Struct):
    id: Any = None
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct):
    """Enough of a stream's `message_start` event to compare it with Anthropic's."""

    message: _Started | None = None


_decode_message = msgspec.json.Decoder(_Message).decode
_decode_start = msgspec.json.Decoder(_MessageStart).decode

# Where an Anthropic reply may differ from Anthropic's format and still be read:
# counted per kind (see docs/performance.md), never failed.
REQUEST_ID = "no request-id header"  # Anthropic sends one on every response; the SDKs expose it as _request_id
ID = "id not msg_…"  # Anthropic's message ids start msg_ (opaque to the SDKs, but every one so far)
NOT_FIRST = "stream not opened by message_start"
NO_INPUT_COUNT = "message_start without the input token count"  # Anthropic counts the prompt before the first token
TEXT = "text not the upstream's"  # a non-streamed reply's text against the fake's own (run_load's `expect_text`)
DIFFERENCES = (REQUEST_ID, ID, TEXT, NOT_FIRST, NO_INPUT_COUNT)


def message_differences(message: _Message, expect_text: str | None) -> list[str]:
    """How a non-streamed Anthropic reply differs from Anthropic's: its id, and its
    text against the one the upstream sent (when known)."""
    out = [] if isinstance(message.id, str) and message.id.startswith("msg_") else [ID]
    if expect_text is not None:
        blocks = message.content if isinstance(message.content, list) else []
        text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        if text != expect_text:
            out.append(TEXT)
    return out


def stream_differences(data: bytes) -> list[str]:
    """How an Anthropic stream's opening differs from Anthropic's: its first event
    (pings, which may come anywhere, and comments aside), that event's message id,
    and its prompt token count (a positive integer)."""
    name, payload = _first_event(data)
    if name != b"message_start":
        return [NOT_FIRST]
    try:
        started = _decode_start(payload).message
    except msgspec.DecodeError:
        return [NOT_FIRST]
    if started is None:
        return [NOT_FIRST]
    out = []
    if not (isinstance(started.id, str) and started.id.startswith("msg_")):
        out.append(ID)
    count = started.usage.input_tokens if started.usage is not None else None
    if not (isinstance(count, int) and count > 0):
        out.append(NO_INPUT_COUNT)
    return out


def _first_event(data: bytes) -> tuple[bytes, bytes]:
    """The name and data of a stream's first SSE event other than a ping, from its
    first 8 KiB; empty names when there is none."""
    head = data[:8192]
    if b"\r" in head:
        head = head.replace(b"\r\n", b"\n")
    pos = 0
    while pos < len(head):
        end = head.find(b"\n\n", pos)
        end = len(head) if end < 0 else end
        name, payload = b"", []
        for line in head[pos:end].split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:"):
                payload.append(line[5:].strip())
        if name and name != b"ping":
            return name, b"\n".join(payload)
        pos = end + 2
    return b"", b""


class _Failure(Exception):
    pass


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stream: bool,
    openai: bool,
    expect_text: str | None = None,
) -> tuple[float, float | None, int, list[str]]:
    """One request: (time to last byte, time to first token or None, text deltas,
    differences from Anthropic's format)."""
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        if not stream:
            data = await response.read()
            end = time.perf_counter()
            if response.status != 200:
                raise _Failure(f"HTTP {response.status}: {data[:300]!r}")
            try:
                message = _decode_message(data)
            except msgspec.DecodeError:
                raise _Failure(f"unreadable body: {data[:300]!r}") from None
            if (message.content is None) if not openai else (message.choices is None):
                raise _Failure(f"not a message: {data[:300]!r}")
            differs = [] if openai else _head_differences(response) + message_differences(message, expect_text)
            return end - start, None, 0, differs
        if response.status != 200:
            raise _Failure(f"HTTP {response.status}: {(await response.read())[:300]!r}")
        differs = [] if openai else _head_differences(response)
        marker = b'"delta":{"content":' if openai else b"content_block_delta"
        first: float | None = None
        chunks = []
        tail = b""
        async for chunk in response.content.iter_any():
            if first is None and (marker in chunk or marker in tail + chunk[: len(marker)]):
                first = time.perf_counter()
            tail = chunk[-len(marker) :]
            chunks.append(chunk)
        end = time.perf_counter()
    data = b"".join(chunks)
    if openai:
        if not data.rstrip().endswith(b"data: [DONE]"):
            raise _Failure(f"stream without [DONE]: ...{data[-300:]!r}")
    elif b"event: message_stop" not in data[-400:] or b"event: error" in data:
        raise _Failure(f"stream without message_stop or with an error: ...{data[-300:]!r}")
    deltas = data.count(marker if openai else b"text_delta")
    if first is None or not deltas:
        raise _Failure("stream without any text delta")
    return end - start, first - start, deltas, differs if openai else differs + stream_differences(data)


def _head_differences(response: aiohttp.ClientResponse) -> list[str]:
    return [] if "request-id" in response.headers else [REQUEST_ID]


async def run_load(
    url: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    concurrency: int = 1,
    duration: float = 5.0,
    max_requests: int | None = None,
    warmup: float = 0.5,
    min_requests: int = 0,
    max_window: float = 60.0,
    stream: bool = False,
    openai: bool = False,
    pid: int | None = None,
    upstream_pid: int | None = None,
    drain_timeout: float = 60.0,
    expect_text: str | None = None,
    chunks: int | None = None,
) -> Result:
    """Runs the load in three phases:

    1. warm-up: at least `warmup` seconds, and until every worker has finished one
       request (so the first burst of a slow server is not measured);
    2. the window: at least `duration` seconds and `min_requests` completions (at most
       `max_window` seconds); completions in it give throughput, latency, CPU per
       request; it also ends when every worker is done (the `max_requests` budget);
    3. the drain: workers send nothing new; replies still running are awaited for up
       to `drain_timeout` seconds, and not counted.

    `expect_text`: the text a non-streamed Anthropic reply should carry (the
    upstream's); one that carries another is counted as a difference (TEXT).
    `chunks`: the text chunks the upstream streams per reply, counted as the reply's chunks
    (CPU per chunk) instead of the deltas received: a gateway may join in one delta the
    text of chunks that reach it together.
    """
    result = Result()
    send_headers = {"content-type": "application/json", **(headers or {})}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    issued = 0
    stop = False
    counting = False
    finished_one = [False] * concurrency
    progress = asyncio.Event()
    snapshot: dict[str, float | int] = {}

    async def worker(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal issued
        while not stop and (max_requests is None or issued < max_requests):
            issued += 1
            try:
                latency, ttft, deltas, differs = await _one(
                    session, url, body, send_headers, stream, openai, expect_text
                )
            except (TimeoutError, _Failure, aiohttp.ClientError, OSError) as error:
                result.errors += 1
                if result.first_error is None:
                    result.first_error = f"{type(error).__name__}: {error}"[:500]
                latency = None
            if latency is not None and counting:
                result.requests += 1
                result.latency.append(latency)
                if ttft is not None:
                    result.ttft.append(ttft)
                result.deltas += chunks or deltas
                for kind in differs:
                    result.differences[kind] = result.differences.get(kind, 0) + 1
            finished_one[index] = True
            progress.set()

    def take(prefix: str) -> None:
        snapshot[prefix + "t"] = time.perf_counter()
        snapshot[prefix + "self"] = self_cpu()
        if pid:
            snapshot[prefix + "cpu"] = cpu_seconds(pid)
            snapshot[prefix + "sleeps"] = sleeps(pid)
            snapshot[prefix + "rss"] = rss_bytes(pid)
        if upstream_pid:
            snapshot[prefix + "up"] = cpu_seconds(upstream_pid)

    async def wait_until(condition: Any, deadline: float, tasks: list[asyncio.Task[None]]) -> None:
        while not condition() and not all(t.done() for t in tasks):
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), min(remaining, 0.05))
            except TimeoutError:
                pass

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker(i, session)) for i in range(concurrency)]
        if warmup > 0:
            await wait_until(
                lambda: time.perf_counter() >= t0 + warmup and all(finished_one), t0 + max(warmup, max_window), tasks
            )
        take("a")
        counting = True
        t_a = time.perf_counter()
        await wait_until(
            lambda: time.perf_counter() >= t_a + duration and result.requests >= min_requests, t_a + max_window, tasks
        )
        counting = False
        stop = True
        take("b")
        done, pending = await asyncio.wait(tasks, timeout=drain_timeout)
        for task in pending:
            task.cancel()
        if pending:
            result.errors += len(pending)
            result.first_error = (
                result.first_error or f"{len(pending)} requests still running {drain_timeout:.0f} s after the window"
            )

    result.window = float(snapshot["bt"]) - float(snapshot["at"])
    result.client_cpu = float(snapshot["bself"]) - float(snapshot["aself"])
    if pid:
        result.cpu = float(snapshot["bcpu"]) - float(snapshot["acpu"])
        result.sleeps = int(snapshot["bsleeps"]) - int(snapshot["asleeps"])
        result.rss_before, result.rss_after = int(snapshot["arss"]), int(snapshot["brss"])
    if upstream_pid:
        result.upstream_cpu = float(snapshot["bup"]) - float(snapshot["aup"])
    return result


async def hold_streams(url: str, body: bytes, *, headers: dict[str, str] | None = None, count: int, pid: int,
                       open_timeout: float = 60.0) -> dict[str, Any]:  # fmt: skip
    """Opens `count` streams that stay idle (a slow model), reads the server's RSS
    before and once all are open, then closes them. Returns the figures."""
    send_headers = {"content-type": "application/json", **(headers or {})}
    rss_before = rss_bytes(pid)
    opened = 0
    all_open = asyncio.Event()
    release = asyncio.Event()
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal opened
        try:
            async with session.post(url, data=body, headers=send_headers) as response:
                if response.status != 200:
                    raise _Failure(f"HTTP {response.status}")
                await response.content.readany()  # the stream has started
                opened += 1
                if opened == count:
                    all_open.set()
                await release.wait()
        except (_Failure, aiohttp.ClientError, OSError) as error:
            errors.append(f"{type(error).__name__}: {error}")
            if opened + len(errors) >= count:
                all_open.set()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        tasks = [asyncio.create_task(one(session)) for _ in range(count)]
        try:
            await asyncio.wait_for(all_open.wait(), open_timeout)
        except TimeoutError:
            errors.append(f"only {opened} of {count} streams open after {open_timeout:.0f} s")
        opened_in = time.perf_counter() - start
        await asyncio.sleep(0.5)
        rss_open = rss_bytes(pid)
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "streams": opened,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "open_s": round(opened_in, 2),
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_open_mb": round(rss_open / 2**20, 1),
        "added_mb": round((rss_open - rss_before) / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shapes

    parser = argparse.ArgumentParser(description="Anthropic /v1/messages load at fixed concurrency.")
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8765/v1/messages")
    parser.add_argument("--shape", choices=shapes.SHAPES, default="tiny")
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--openai", action="store_true", help="send the OpenAI Chat Completions twin instead")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tokens", type=int, default=100, help="max_tokens (the fake upstream sends that many)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of measurement after the warm-up")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--requests", type=int, default=None, help="stop after this many requests")
    parser.add_argument(
        "--min-requests", type=int, default=0, help="extend the window until this many replies finished"
    )
    parser.add_argument("--pid", type=int, default=None, help="server process to read CPU and RSS from")
    parser.add_argument("--api-key", default="bench-key")
    args = parser.parse_args(argv)
    make = shapes.openai_body if args.openai else shapes.anthropic_body
    body = make(args.shape, model=args.model, max_tokens=args.tokens, stream=args.stream)
    headers = (
        {"authorization": f"Bearer {args.api_key}"}
        if args.openai
        else {"x-api-key": args.api_key, "anthropic-version": "2023-06-01"}
    )
    coro = run_load(args.url, body, headers=headers, concurrency=args.concurrency, duration=args.duration,
                    max_requests=args.requests, min_requests=args.min_requests, warmup=args.warmup, stream=args.stream, openai=args.openai, pid=args.pid)  # fmt: skip
    try:
        import uvloop

        result = uvloop.run(coro)
    except ImportError:
        result = asyncio.run(coro)
    print(msgspec.json.format(msgspec.json.encode(result.summary()), indent=2).decode())
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
