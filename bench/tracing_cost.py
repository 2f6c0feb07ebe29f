"""What tracing costs: dragoman's CPU per request with tracing off and on (every request
sampled, spans and GenAI metrics exported over OTLP/HTTP to a sink in this process), in
interleaved rounds on one fake upstream, as a ratio in one run.

    python bench/tracing_cost.py               # about a minute
    python bench/tracing_cost.py --rounds 6 --duration 12

Needs the otel extra (`pip install -e '.[otel]'`). Both gateways are pinned to the last
CPU, the fake upstream and the load to the others, as in bench/run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402
import shapes  # noqa: E402
from run import MODEL, Processes, Server, log, start_fake, start_translating  # noqa: E402

MODES = {"json": False, "stream100": True}


class _Sink(BaseHTTPRequestHandler):
    """Takes an OTLP export and answers 200: the collector's cost is not the gateway's."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def measure(server: Server, fake: Server, shape: str, mode: str, seconds: float) -> load.Result:
    body = shapes.anthropic_body(shape, model=MODEL, max_tokens=100, stream=MODES[mode])
    return await load.run_load(server.url, body, headers=server.headers, concurrency=1, duration=seconds, warmup=0.3,
                               stream=MODES[mode], pid=server.pid, upstream_pid=fake.pid)  # fmt: skip


async def compare(gateways: dict[str, Server], fake: Server, args: argparse.Namespace) -> list[str]:
    lines = [
        "| shape | mode | CPU/request off (µs) | CPU/request on (µs) | added (µs) | on / off |",
        "|---|---|---|---|---|---|",
    ]
    for shape in args.shapes.split(","):
        for mode in MODES:
            cpu = {name: 0.0 for name in gateways}
            replies = {name: 0 for name in gateways}
            for _ in range(args.rounds):  # interleaved: off, on, off, on, ...
                for name, server in gateways.items():
                    result = await measure(server, fake, shape, mode, args.duration / args.rounds)
                    if result.errors:
                        raise RuntimeError(f"{name}: {result.first_error}")
                    cpu[name] += result.cpu or 0.0
                    replies[name] += result.requests
            off, on = (cpu[n] / max(1, replies[n]) * 1e6 for n in ("off", "on"))
            lines.append(f"| {shape} | {mode} | {off:.0f} | {on:.0f} | {on - off:+.0f} | {on / off:.2f}× |")
            log(lines[-1])
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per cell and gateway, over all rounds")
    parser.add_argument("--shapes", default="tiny,claude-code")
    args = parser.parse_args()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpus, client_cpus = ({cpus[-1]}, set(cpus[:-1])) if len(cpus) > 1 else (None, None)
    traced = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    untraced = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SDK_DISABLED": "true"}
    with tempfile.TemporaryDirectory() as workdir:
        procs = Processes(Path(workdir), gateway_cpus, client_cpus)
        try:
            fake = start_fake(procs, slow_delay_ms=5000)
            gateways = {
                "off": start_translating(procs, fake, "off", untraced),
                "on": start_translating(procs, fake, "on", traced),
            }
            lines = asyncio.run(compare(gateways, fake, args))
        finally:
            procs.stop_all()
            sink.shutdown()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
