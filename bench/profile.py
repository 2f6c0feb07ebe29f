"""Profile a dragoman path under load with py-spy, and summarise the hot spots.

Starts the fake upstream and one gateway (translating by default), drives a case
at fixed concurrency while `py-spy record` samples the gateway, and prints the
functions with the most samples: self time (the function was running) and total
time (it was on the stack). The raw collapsed stacks are kept for flame graphs
(e.g. `py-spy`'s own SVG, speedscope, or flamegraph.pl).

    pip install py-spy            # into the venv that runs the gateway
    python bench/profile.py --case tiny:json --case tiny:stream100 [--path passthrough|team]
        [--concurrency 32] [--seconds 10] [--native] [--out /tmp/dragoman-profile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402
import run as bench  # noqa: E402
import shapes  # noqa: E402

_LINE = re.compile(r":\d+\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


def _group(frame: str) -> str:
    """The package a frame belongs to: `dragoman/backends`, `aiohttp`, `asyncio`, ..."""
    where = frame[frame.rfind("(") + 1 : -1]
    parts = where.split("/")
    if parts[0] == "dragoman" and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0] == "dragoman":
        return where
    return parts[0] if len(parts) > 1 else f"stdlib {where}"


def summarise(raw: Path, top: int) -> str:
    """Self and total sample shares per function from py-spy's collapsed stacks."""
    self_counts: collections.Counter[str] = collections.Counter()
    total_counts: collections.Counter[str] = collections.Counter()
    groups: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE.sub(")", f) for f in stack.split(";") if not f.startswith(("process ", "thread ("))]
        if not frames:
            continue
        samples += n
        self_counts[frames[-1]] += n
        groups[_group(frames[-1])] += n
        for frame in set(frames):
            total_counts[frame] += n
    if not samples:
        return "no samples (is the gateway idle, or ptrace not permitted?)"
    out = [f"{samples} samples", "", "self %  function (where the CPU was)"]
    out += [f"{c / samples * 100:6.1f}  {f}" for f, c in self_counts.most_common(top)]
    out += ["", "self %  package or dragoman module"]
    out += [f"{c / samples * 100:6.1f}  {g}" for g, c in groups.most_common(top)]
    out += ["", "total % function (on the stack; the entry chain that every sample shares is left out)"]
    shown = [(f, c) for f, c in total_counts.most_common() if c < 0.9 * samples][:top]
    out += [f"{c / samples * 100:6.1f}  {f}" for f, c in shown]
    return "\n".join(out)


async def profile_case(
    gateway: bench.Server, fake: bench.Server, shape: str, mode: str, args: argparse.Namespace
) -> None:
    stream, tokens, model = bench.MODES[mode]
    body = shapes.anthropic_body(shape, model=model, max_tokens=tokens, stream=stream)
    raw = Path(args.out) / f"{args.path}-{shape}-{mode}-c{args.concurrency}.txt"
    argv = [py_spy(), "record", "--pid", str(gateway.pid), "--rate", str(args.rate), "--format", "raw",
            "--output", str(raw), "--duration", str(int(args.seconds))]  # fmt: skip
    if args.native:
        argv.append("--native")
    if args.gil:
        argv.append("--gil")
    if args.nonblocking:
        argv.append("--nonblocking")
    # Warm the gateway up, then sample while the load runs.
    await load.run_load(
        gateway.url, body, headers=gateway.headers, concurrency=args.concurrency, duration=1, warmup=0, stream=stream
    )
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    result = await load.run_load(gateway.url, body, headers=gateway.headers, concurrency=args.concurrency,
                                 duration=args.seconds + 1, warmup=0.5, stream=stream, pid=gateway.pid)  # fmt: skip
    _, err = spy.communicate(timeout=60)
    print(f"\n== {args.path}, {shape} {mode}, c={args.concurrency}: {result.throughput:.0f} req/s, "
          f"{result.cpu_per_request_ms or 0:.3f} ms CPU per request, {result.errors} errors; raw stacks: {raw}")  # fmt: skip
    if spy.returncode != 0 or not raw.exists():
        print(f"py-spy failed ({spy.returncode}): {err.decode(errors='replace').strip()}")
        return
    print(summarise(raw, args.top))


async def main_async(args: argparse.Namespace, procs: bench.Processes) -> None:
    fake = bench.start_fake(procs, slow_delay_ms=5000)
    starters = {
        "translating": bench.start_translating,
        "passthrough": bench.start_passthrough,
        "team": bench.start_team,
    }
    gateway = starters[args.path](procs, fake)
    for case in args.case:
        shape, _, mode = case.partition(":")
        await profile_case(gateway, fake, shape, mode or "json", args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="py-spy profile of a dragoman path under load")
    parser.add_argument("--path", choices=("translating", "passthrough", "team"), default="translating")
    parser.add_argument("--case", action="append", help="shape:mode, e.g. tiny:json, tiny:stream100 (repeatable)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--native", action="store_true", help="include C frames (uvloop, msgspec, httptools)")
    parser.add_argument("--gil", action=argparse.BooleanOptionalAction, default=True,
                        help="only samples where a thread holds the GIL (CPU work, not waits)")  # fmt: skip
    parser.add_argument("--nonblocking", action="store_true", help="do not pause the gateway to sample (less exact)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None, help="directory for the raw stacks (default: a new temporary one)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    args.case = args.case or ["tiny:json", "tiny:stream100"]
    args.out = args.out or tempfile.mkdtemp(prefix="dragoman-profile-")
    os.makedirs(args.out, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpus = client_cpus = None
    if args.pin and len(cpus) >= 2:
        gateway_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1])
        os.sched_setaffinity(0, client_cpus)
    with tempfile.TemporaryDirectory(prefix="dragoman-profile-run-") as workdir:
        procs = bench.Processes(Path(workdir), gateway_cpus, client_cpus)
        try:
            asyncio.run(main_async(args, procs))
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
