"""Interleaved A/B rounds of two builds of dragoman on one fake upstream.

The build under test is the one installed in this venv; the other (`--base`, a `src`
directory such as a worktree of main) runs the same `python -m dragoman` with that
directory first on PYTHONPATH. For each case and path the two run alternately, the
order flipped each round, so a burst of noise from the machine lands on both; the path's
baseline (the direct call to the fake) runs in the same rounds. Reported per build: CPU per
request in each round and over all of them, the p50 latency, and the added p50 and p99.

    python bench/ab.py --base /work/main/src --rounds 5 --duration 2
    python bench/ab.py --base ../main/src --cases tiny:stream100:1,claude-code:paced100:1 --paths translating
    python bench/ab.py --base ../main/src --cases tiny:json:1,tiny:json:32 --paths translating,limits-redis
    python bench/ab.py --base ../main/src --cases tiny:json:1 --paths translating,team --rounds 8 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402
import run  # noqa: E402

STARTERS = {"translating": run.start_translating, "passthrough": run.start_passthrough,
            run.LIMITS: run.start_limited, run.LIMITS_REDIS: run.start_limited, run.TEAM: run.start_team}  # fmt: skip


def parse_cases(text: str) -> list[run.Case]:
    out = []
    for item in text.split(","):
        shape, mode, concurrency = item.strip().split(":")
        out.append(run.Case(shape, mode, int(concurrency)))
    return out


async def compare(args: argparse.Namespace, procs: run.Processes) -> int:
    fake = run.start_fake(procs, slow_delay_ms=5000)
    base_env = {"PYTHONPATH": str(Path(args.base).resolve())}
    servers = {}
    for path in args.paths:
        servers[(path, "A")] = STARTERS[path](procs, fake, name=f"{path}-A", env=base_env)  # type: ignore[operator]
        servers[(path, "B")] = STARTERS[path](procs, fake, name=f"{path}-B")  # type: ignore[operator]
    measure_args = argparse.Namespace(
        smoke=False, warmup=args.warmup, duration=args.duration * args.rounds, max_window=40.0
    )
    failed = False
    print(
        f"A: {args.base}   B: this venv's build   {args.rounds} rounds of {args.duration:g} s, order flipped each round"
    )
    for path in args.paths:
        for case in args.cases:
            cpu: dict[str, list[float]] = {"A": [], "B": []}
            results: dict[str, list[load.Result]] = {"A": [], "B": [], "direct": []}
            for round_ in range(args.rounds):
                for build in ("A", "B", "direct") if round_ % 2 == 0 else ("direct", "B", "A"):
                    target, server = (run.BASELINE[path], fake) if build == "direct" else (path, servers[(path, build)])
                    result = await run.measure(target, server, fake, case, measure_args, rounds=args.rounds,
                                               first=round_ == 0)  # fmt: skip
                    failed = failed or result.errors > 0
                    results[build].append(result)
                    if build != "direct":
                        cpu[build].append(result.cpu_per_request_ms or 0.0)
            base = run.merge(results["direct"])
            for build in ("A", "B"):
                merged = run.merge(results[build])
                rounds = " ".join(f"{c:.3f}" for c in cpu[build])
                print(f"{path:12} {case.label:28} {build}: cpu {merged.cpu_per_request_ms or 0:.3f} ms/req "
                      f"(median {statistics.median(cpu[build]):.3f}; rounds {rounds}), sleeps/req "
                      f"{merged.sleeps_per_request or 0:.2f}, p50 {merged.ms(50):.2f} ms, "
                      f"added p50 {merged.ms(50) - base.ms(50):.2f} / p99 {merged.ms(99) - base.ms(99):.2f} ms")  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the src directory of the build to compare against (A)")
    parser.add_argument("--paths", default="translating,passthrough")
    parser.add_argument("--cases", default="tiny:stream100:1,claude-code:stream100:1,tiny:paced100:1,tiny:stream100:32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per build per round")
    parser.add_argument("--warmup", type=float, default=0.5)
    args = parser.parse_args()
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    args.cases = parse_cases(args.cases)
    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpus = client_cpus = None
    if len(cpus) >= 2:
        gateway_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1])
        os.sched_setaffinity(0, client_cpus)
    with tempfile.TemporaryDirectory(prefix="dragoman-ab-") as workdir:
        procs = run.Processes(Path(workdir), gateway_cpus, client_cpus)
        try:
            return asyncio.run(compare(args, procs))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
