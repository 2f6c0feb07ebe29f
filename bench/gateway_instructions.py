"""User-space instructions per request of the whole gateway, under valgrind's callgrind.

    python bench/gateway_instructions.py [--paths translating,passthrough]
        [--cases tiny:stream100,tiny:stream500,claude-code:stream100,claude-code:stream500] [--requests 100]
        [--base OTHER/src] [--replicas] [--tagged]

The same under any load, unlike CPU time (this machine's other work moves that by 10 % and
more): each path's `dragoman serve` runs under callgrind in front of the fake upstream; per
case, after 10 requests of warm-up the counters are zeroed, `--requests` requests go one at
a time, and the counters are dumped. Kernel work (the writes and reads themselves) is not
counted; CPU time (`bench/ab.py`) is the measure that has it.

`--replicas`: the passthrough upstream has a second replica (another fake), so it routes cache
aware and tags tool ids (backends/anthropic/tool_tags.py); `--tagged`: the request's tool ids
are tagged, as a client sends them back behind such an upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402
import run  # noqa: E402
import shapes  # noqa: E402

HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}


def start(procs: run.Processes, fake: run.Server, path: str, out: Path, base: str | None = None,
          replica: run.Server | None = None) -> run.Server:  # fmt: skip
    """One gateway under callgrind, its counts dumped into `out` when asked; `base`, a `src`
    directory, runs that build instead of the installed one; `replica`, a passthrough upstream's second."""
    port = run.free_port()
    if path == "translating":
        argv = ["-m", "dragoman", "serve", "--upstream", fake.url, "--port", str(port), "--log-level", "warning"]
    else:
        config = procs.workdir / "passthrough.toml"
        config.write_text(
            f'[server]\nlog_level = "warning"\n\n[upstreams.fake]\nurl = "{fake.url.removesuffix("/v1")}"\n'
            f'protocol = "anthropic"\n'
            + (f'replicas = ["{replica.url.removesuffix("/v1")}"]\n' if replica is not None else "")
            + f'\n[[models]]\nname = "{run.MODEL}"\nupstream = "fake"\n'
        )
        argv = ["-m", "dragoman", "serve", "--config", str(config), "--port", str(port)]
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/{path}.%p"]
    server = procs.start(path, [*valgrind, sys.executable, *argv], f"http://127.0.0.1:{port}/v1/messages",
                         gateway=True, headers=HEADERS, env={"PYTHONPATH": str(Path(base).resolve())} if base else None)  # fmt: skip
    run.wait_ready(server, shapes.anthropic_body("tiny", model=run.MODEL, max_tokens=5, stream=False), 600)
    return server


def dumped(server: run.Server, out: Path, path: str, previous: int) -> int:
    """Dump the counters; the instructions since they were zeroed."""
    subprocess.run(["callgrind_control", "--dump", str(server.pid)], check=True, capture_output=True)
    files = sorted(out.glob(f"{path}.*"), key=lambda f: f.stat().st_mtime)
    for text in (f.read_text(errors="replace") for f in reversed(files)):
        found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if found and int(found.group(1)) != previous:
            return int(found.group(1))
    raise RuntimeError("no callgrind dump found")


async def requests(server: run.Server, case: str, count: int, tagged: bool = False) -> None:
    shape, mode = case.split(":")
    stream, tokens, model = run.MODES[mode]
    body = shapes.anthropic_body(shape, model=model, max_tokens=tokens, stream=stream)
    if tagged:
        body = msgspec.json.encode(shapes.with_tagged_ids(msgspec.json.decode(body)))
    result = await load.run_load(server.url, body, headers=HEADERS, concurrency=1, duration=3600, max_requests=count,
                                 warmup=0, stream=stream, drain_timeout=600)  # fmt: skip
    if result.errors:
        raise RuntimeError(f"{result.errors} requests failed")


async def measure(args: argparse.Namespace, procs: run.Processes, out: Path) -> None:
    fake = run.start_fake(procs, slow_delay_ms=5000)
    replica = run.start_fake(procs, slow_delay_ms=5000, name="fake-replica") if args.replicas else None
    print(f"{'case':24} {'path':12} {'instructions per request':>26}")
    for path in args.paths:
        server = start(procs, fake, path, out, args.base, replica)
        previous = 0
        for case in args.cases:
            await requests(server, case, 10, args.tagged)
            subprocess.run(["callgrind_control", "--zero", str(server.pid)], check=True, capture_output=True)
            await requests(server, case, args.requests, args.tagged)
            previous = dumped(server, out, path, previous)
            print(f"{case:24} {path:12} {previous / args.requests:26,.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default="translating,passthrough")
    parser.add_argument("--cases", default="tiny:stream100,tiny:stream500,claude-code:stream100,claude-code:stream500")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--base", help="the src directory of another build to count instead (as bench/ab.py's --base)")
    parser.add_argument("--replicas", action="store_true", help="passthrough with two replicas (cache aware, tags)")
    parser.add_argument("--tagged", action="store_true", help="the requests' tool ids tagged")
    args = parser.parse_args()
    args.paths, args.cases = args.paths.split(","), args.cases.split(",")
    with tempfile.TemporaryDirectory() as work:
        procs = run.Processes(Path(work), None, None)
        try:
            asyncio.run(measure(args, procs, Path(work)))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
