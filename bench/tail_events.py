"""Where the slowest tiny requests' time goes, over real sockets: each request the client timed
matched with what the gateway process did meanwhile (bench/tail_hook.py records it).

    python bench/tail_events.py [--requests 20000] [--blocks 10] [--base ../main/src] [--team] [--nice -10]

A fake upstream and `dragoman serve` (default configuration: usage accounting on, SQLite; with
`--team`, bench/team.py's: keys, limits in Redis, usage in PostgreSQL, two replicas),
pinned as bench/run.py pins them; one request at a time, tiny and non-streaming, in blocks
alternating with the same count sent straight to the fake (the baseline). Every time is
CLOCK_MONOTONIC, shared by the processes. For the requests at or above the gateway's p99 and
for all of them, it prints the phases (client to gateway, the loop's turn, the app: its CPU,
the run queue, the upstream, the main thread blocked; back to the client) and how often a
garbage collection, a thread-pool job (the usage writer's), the client's own collection or a
wait in the run queue overlapped them. `--base` runs another src tree's build instead.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
import shapes  # noqa: E402

HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
BLOCKED_OVER = 100e-6  # s of a request's app time the main thread was blocked (not CPU, not run queue, not upstream)
QUEUED_OVER = 100e-6  # s in the run queue


def client_gc() -> list[tuple[float, float, int]]:
    found: list[tuple[float, float, int]] = []
    began: list[float] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            found.append((began[0], time.perf_counter(), info["generation"]))

    gc.callbacks.append(callback)
    return found


async def send(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], count: int,
               into: list[tuple[float, float]]) -> None:  # fmt: skip
    for _ in range(count):
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}")
        into.append((t0, time.perf_counter()))


async def load(gateway: run.Server, fake: run.Server, requests: int, blocks: int) -> tuple[list[Any], list[Any]]:
    """(gateway's, baseline's) (start, end) per request, in alternating blocks, after a warm-up."""
    through: list[tuple[float, float]] = []
    direct: list[tuple[float, float]] = []
    body = shapes.anthropic_body("tiny", model=run.MODEL, max_tokens=100, stream=False)
    twin = shapes.openai_body("tiny", model=run.MODEL, max_tokens=100, stream=False)
    plain = {"authorization": "Bearer sk-fake-upstream", "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    ours = {**gateway.headers, "content-type": "application/json"}
    to_gateway = (gateway.url, body, ours, through)
    to_fake = (fake.url + "/chat/completions", twin, plain, direct)
    async with aiohttp.ClientSession(connector=connector) as session:
        await send(session, gateway.url, body, ours, 500, [])
        await send(session, fake.url + "/chat/completions", twin, plain, 500, [])
        for block in range(blocks):
            for url, data, headers, into in (to_gateway, to_fake) if block % 2 == 0 else (to_fake, to_gateway):
                await send(session, url, data, headers, requests // blocks, into)
    return through, direct


class Spans:
    """Spans (start, end, ...) sorted by start, for lookups by time."""

    def __init__(self, spans: list[Any]) -> None:
        self.spans = sorted(spans)
        self.starts = [s[0] for s in self.spans]

    def overlapping(self, t0: float, t1: float) -> list[Any]:
        out = []
        i = bisect.bisect_right(self.starts, t1)
        while i > 0:
            i -= 1
            if self.spans[i][1] >= t0:
                out.append(self.spans[i])
            elif self.starts[i] < t0 - 1.0:  # no span lasts a second
                break
        return out

    def first_in(self, t0: float, t1: float) -> Any:
        """The first span starting in [t0, t1], or None."""
        i = bisect.bisect_left(self.starts, t0)
        return self.spans[i] if i < len(self.spans) and self.starts[i] <= t1 else None


def phases(requests: list[tuple[float, float]], ev: dict[str, Any], seen_gc: list[Any]) -> list[dict[str, Any]]:
    apps, ups, gcs, jobs, client = Spans(ev["app"]), Spans(ev["up"]), Spans(ev["gc"]), Spans(ev["jobs"]), Spans(seen_gc)
    recvs = sorted(ev["recv"])
    out = []
    for t0, t1 in requests:
        app = apps.first_in(t0, t1)
        if app is None:
            continue
        i = bisect.bisect_left(recvs, t0)
        recv = recvs[i] if i < len(recvs) and recvs[i] <= app[0] else app[0]
        up = ups.first_in(app[0], app[1]) or (app[0], app[0], 0.0)
        wall = app[1] - app[0]
        blocked = max(0.0, (wall - (up[1] - up[0])) - (app[2] - up[2]) - app[3])
        out.append({"total": t1 - t0, "to": recv - t0, "turn": app[0] - recv, "app": wall, "cpu": app[2],
                    "queued": app[3], "upstream": up[1] - up[0], "blocked": blocked, "back": t1 - app[1],
                    "gc": [g[2] for g in gcs.overlapping(t0, t1)], "jobs": [j[3] for j in jobs.overlapping(t0, t1)],
                    "client_gc": [g[2] for g in client.overlapping(t0, t1)]})  # fmt: skip
    return out


def report(
    rows: list[dict[str, Any]], direct: list[tuple[float, float]], ev: dict[str, Any], begin: float, end: float
) -> None:
    seconds = end - begin
    totals = sorted(r["total"] for r in rows)
    base = sorted(t1 - t0 for t0, t1 in direct)

    def q(values: list[float], share: float) -> float:
        return values[min(len(values) - 1, int(len(values) * share))] * 1e3

    print(f"{len(rows)} requests through the gateway, {len(base)} straight to the fake, load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for share in (0.5, 0.9, 0.99, 0.999):
        print(f"  p{share * 100:g}: gateway {q(totals, share):.3f} ms, direct {q(base, share):.3f} ms, "
              f"added {q(totals, share) - q(base, share):.3f} ms")  # fmt: skip
    cut = totals[int(len(totals) * 0.99)]
    slow = [r for r in rows if r["total"] >= cut]
    print("\nmedian µs per phase | all | slowest 1 %")
    for name in ("total", "to", "turn", "app", "cpu", "queued", "upstream", "blocked", "back"):
        print(f"  {name:9} | {statistics.median(r[name] for r in rows) * 1e6:7.0f} | "
              f"{statistics.median(r[name] for r in slow) * 1e6:7.0f}")  # fmt: skip
    print("\nshare of requests overlapped by | all | slowest 1 %")
    tests = {"a gateway GC, any generation": lambda r: bool(r["gc"]), "a gateway GC of generation 2": lambda r: 2 in r["gc"],
             "a thread-pool job": lambda r: bool(r["jobs"]), "the client's own GC": lambda r: bool(r["client_gc"]),
             f"> {QUEUED_OVER * 1e6:.0f} µs in the run queue": lambda r: r["queued"] > QUEUED_OVER,
             f"> {BLOCKED_OVER * 1e6:.0f} µs blocked (GIL, Redis)": lambda r: r["blocked"] > BLOCKED_OVER,
             "none of these": lambda r: not (r["gc"] or r["jobs"] or r["client_gc"] or r["queued"] > QUEUED_OVER
                                             or r["blocked"] > BLOCKED_OVER)}  # fmt: skip
    for label, test in tests.items():
        print(
            f"  {label:34} | {sum(map(test, rows)) / len(rows) * 100:5.1f} % | {sum(map(test, slow)) / len(slow) * 100:5.1f} %"
        )
    jobs = Counter(j for r in slow for j in set(r["jobs"]))
    print("  jobs in the slowest: " + (", ".join(f"{n} {c}" for n, c in jobs.most_common(6)) or "none"))
    print("\nrequests overlapped by a job, against those by none: count, median total / run queue µs")
    quiet = [r for r in rows if not r["jobs"]]
    for name in sorted({j for r in rows for j in r["jobs"]}):
        hit = [r for r in rows if name in r["jobs"]]
        print(f"  {name:28} {len(hit):6} {statistics.median(r['total'] for r in hit) * 1e6:7.0f} / "
              f"{statistics.median(r['queued'] for r in hit) * 1e6:5.0f}")  # fmt: skip
    if quiet:
        print(f"  {'(no job)':28} {len(quiet):6} {statistics.median(r['total'] for r in quiet) * 1e6:7.0f} / "
              f"{statistics.median(r['queued'] for r in quiet) * 1e6:5.0f}")  # fmt: skip
    print("\nin the gateway meanwhile:")
    for name, group in sorted(Counter(j[3] for j in ev["jobs"]).items()):
        these = [j for j in ev["jobs"] if j[3] == name]
        walls, cpus = sorted(j[1] - j[0] for j in these), sorted(j[2] for j in these)
        print(f"  job {name}: {group / seconds:.1f}/s, wall p50 {q(walls, 0.5) * 1e3:.0f} µs max {walls[-1] * 1e6:.0f}, "
              f"CPU p50 {q(cpus, 0.5) * 1e3:.0f} µs")  # fmt: skip
    for generation in (0, 1, 2):
        these = sorted(g[1] - g[0] for g in ev["gc"] if g[2] == generation)
        cpus = sorted(g[3] for g in ev["gc"] if g[2] == generation)
        if these:
            print(f"  GC generation {generation}: {len(these) / seconds:.2f}/s, wall p50 {q(these, 0.5) * 1e3:.0f} µs, "
                  f"max {these[-1] * 1e6:.0f}; CPU p50 {q(cpus, 0.5) * 1e3:.0f} µs, max {cpus[-1] * 1e6:.0f}")  # fmt: skip
    print(f"  threads at exit: {', '.join(ev.get('threads', []))}; switch interval {ev.get('switch_interval')}")
    for generation, at, count, kinds in ev.get("young", []):
        print(
            f"  a collection of generation {generation} ({'in' if begin <= at <= end else 'outside'} the window) "
            f"found {count} objects: {kinds}"
        )
    print(f"  the old generation at exit: {ev['old'][0]} objects ({ev['old'][2]} frozen): {ev['old'][1]}")


def start_hooked(procs: run.Processes, fake: run.Server, out: Path, env: dict[str, str], team: bool) -> run.Server:
    if team:
        return run.start_team(procs, fake, env=env, command=[sys.executable, str(HERE / "tail_hook.py"), str(out)])

    def launch(port: int) -> tuple[list[str], str]:
        argv = [sys.executable, str(HERE / "tail_hook.py"), str(out), "serve", "--upstream", fake.url, "--port", str(port),
                "--log-level", "warning"]  # fmt: skip
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    probe = shapes.anthropic_body("tiny", model=run.MODEL, max_tokens=5, stream=False)
    return run.start_on_a_free_port(procs, "gateway", launch, probe, 30, gateway=True, headers=HEADERS, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--base", help="a src directory to run instead of this venv's build")
    parser.add_argument("--team", action="store_true", help="every team feature on (bench/team.py's configuration)")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run this and its servers at this niceness (-10: ahead of others' work on a shared machine; root)",
    )
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)
    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpus = client_cpus = None
    if len(cpus) >= 2:
        gateway_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1])
        os.sched_setaffinity(0, client_cpus)
    env = {"PYTHONPATH": str(Path(args.base).resolve())} if args.base else {}
    with tempfile.TemporaryDirectory(prefix="dragoman-tail-") as workdir:
        procs = run.Processes(Path(workdir), gateway_cpus, client_cpus)
        out = Path(workdir) / "events.json"
        try:
            fake = run.start_fake(procs, slow_delay_ms=5000)
            gateway = start_hooked(procs, fake, out, {**env, "XDG_DATA_HOME": workdir}, args.team)
            seen_gc = client_gc()
            through, direct = asyncio.run(load(gateway, fake, args.requests, args.blocks))
            os.killpg(gateway.pid, signal.SIGTERM)
            gateway.process.wait(30)
        finally:
            procs.stop_all()
        ev = msgspec.json.decode(out.read_bytes())
    begin, end = min(through[0][0], direct[0][0]), max(through[-1][1], direct[-1][1])
    for name in ("gc", "jobs", "app", "up"):  # what start-up and shutdown did is left out
        ev[name] = [e for e in ev[name] if begin <= e[0] <= end]
    report(phases(through, ev, sorted(seen_gc)), direct, ev, begin, end)


if __name__ == "__main__":
    main()
