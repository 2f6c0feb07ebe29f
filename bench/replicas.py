"""Routing policies on real replicas: two llama-servers behind dragoman, the same replay each.

    python bench/replicas.py                    # round_robin and cache_aware, one round
    python bench/replicas.py --rounds 3 --policies round_robin,least_loaded,cache_aware

Each policy gets two fresh llama-server replicas (dragoman_local.localmodel.LlamaServer: the
project's SmolLM2-135M build, `--parallel` slots each, prompt caching on, `--metrics`) and a
fresh `dragoman serve` in front of them with `routing` set to the policy. The replay: several
conversations at once, shaped like Claude Code's: one long system prompt they all share, a
first user turn of their own, then turns that each repeat the conversation so far and add a
tool-result-sized user turn, each conversation with its own `x-claude-code-session-id`. Sent
with the official SDK, streamed; the time to first token is the first text delta's arrival.

Before the replay each replica computes the shared system prompt once (sent to it directly, not
counted): in a fleet that has run a while every replica holds it, whatever the policy. What each
server then had to evaluate is read from the servers themselves: the growth of
`llamacpp:prompt_tokens_total` (prompt tokens evaluated) and `llamacpp:prompt_tokens_cached_total`
(taken from its cache) on each replica's /metrics over the replay. Rounds alternate the policies, so a change in
the machine's load (its cores are shared) falls on both. The defaults are small: SmolLM2 on two
shared cores evaluates a few hundred prompt tokens a second at best.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import anthropic

from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, LlamaServer, free_port

WORDS = ("parser", "module", "request", "token", "replica", "cache", "stream", "buffer", "test", "config", "error",
         "retry", "socket", "header", "budget", "schema", "thread", "worker", "queue", "prefix")  # fmt: skip


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _metric(base_url: str, name: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def _counts(server: LlamaServer) -> tuple[float, float]:
    """(prompt tokens evaluated, prompt tokens taken from the cache) so far, by the server's own count."""
    return (_metric(server.base_url, "llamacpp:prompt_tokens_total"),
            _metric(server.base_url, "llamacpp:prompt_tokens_cached_total"))  # fmt: skip


def _warm(server: LlamaServer, system: str) -> None:
    """The shared system prompt, computed once on each replica before the replay (not counted):
    in a fleet that has run a while every replica holds it, whatever the policy."""
    body = {"model": DEFAULT_LOCAL_MODEL, "max_tokens": 1,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]}  # fmt: skip
    request = urllib.request.Request(server.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=900) as response:
        response.read()


def _start_gateway(workdir: Path, servers: list[LlamaServer], policy: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = workdir / f"{policy}.toml"
    config.write_text(
        f'[server]\nport = {port}\ndefault_model = "{DEFAULT_LOCAL_MODEL}"\n\n[upstreams.local]\n'
        f'url = "{servers[0].base_url}/v1"\nreplicas = {json.dumps([s.base_url + "/v1" for s in servers[1:]])}\n'
        f'routing = "{policy}"\nflavor = "llamacpp"\nfirst_byte_timeout = 900.0\n'
    )
    log = open(workdir / f"gateway-{policy}.log", "wb")  # noqa: SIM115 (the child keeps it)
    process = subprocess.Popen([sys.executable, "-m", "dragoman", "serve", "--config", str(config)], stdout=log,
                               stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dragoman exited: {(workdir / f'gateway-{policy}.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("dragoman did not start")


async def _conversation(client: anthropic.AsyncAnthropic, index: int, args: argparse.Namespace, system: str,
                        ttfts: list[float]) -> None:  # fmt: skip
    rng = random.Random(args.seed * 1000 + index)
    session = f"bench-session-{args.seed}-{index}"
    messages: list[dict[str, str]] = []
    for turn in range(args.turns):
        words = args.first_words if turn == 0 else args.turn_words
        messages.append({"role": "user", "content": f"Conversation {index}, step {turn}: " + _text(rng, words)})
        started = time.perf_counter()
        first: float | None = None
        async with client.messages.stream(model=DEFAULT_LOCAL_MODEL, max_tokens=args.max_tokens, system=system,
                                          messages=messages, extra_body={"temperature": 0.0},
                                          extra_headers={"x-claude-code-session-id": session}) as stream:  # fmt: skip
            async for _ in stream.text_stream:
                if first is None:
                    first = time.perf_counter()
            reply = await stream.get_final_text()
        ttfts.append((first or time.perf_counter()) - started)
        messages.append({"role": "assistant", "content": reply or "ok"})


async def _replay(url: str, args: argparse.Namespace, system: str) -> list[float]:
    ttfts: list[float] = []
    client = anthropic.AsyncAnthropic(base_url=url, api_key="bench", max_retries=0, timeout=900)
    try:
        await asyncio.gather(*(_conversation(client, i, args, system, ttfts) for i in range(args.conversations)))
    finally:
        await client.close()
    return ttfts


def measure(policy: str, args: argparse.Namespace, workdir: Path) -> dict[str, float | str]:
    system = "You are a careful coding agent. Rules: " + _text(random.Random(args.seed), args.system_words)
    extra = ["--metrics", *args.server_args.split()]
    servers = [LlamaServer(ctx=args.ctx, parallel=args.parallel, extra_args=extra, log_dir=workdir)
               for _ in range(args.replicas)]  # fmt: skip
    gateway: subprocess.Popen[bytes] | None = None
    try:
        for server in servers:
            server.start()
        gateway, url = _start_gateway(workdir, servers, policy)
        for server in servers:
            _warm(server, system)
        before = [_counts(server) for server in servers]
        started = time.perf_counter()
        ttfts = asyncio.run(_replay(url, args, system))
        elapsed = time.perf_counter() - started
        after = [_counts(server) for server in servers]
        evaluated = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        cached = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        for server in servers:
            server.stop()
    return {"policy": policy, "evaluated": evaluated, "cached": cached, "requests": len(ttfts),
            "ttft_p50": statistics.median(ttfts), "ttft_mean": statistics.fmean(ttfts), "ttft_max": max(ttfts),
            "seconds": elapsed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="round_robin,cache_aware")
    parser.add_argument("--rounds", type=int, default=1, help="each policy once per round, alternating")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2, help="slots per llama-server")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--server-args", default="", help="more llama-server arguments, e.g. '--cache-ram 0 -t 1'")
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-words", type=int, default=200, help="the shared system prompt")
    parser.add_argument("--first-words", type=int, default=40, help="each conversation's first user turn")
    parser.add_argument("--turn-words", type=int, default=60, help="each later user turn (a tool result, say)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--logs", help="keep the servers' and gateways' logs in this directory")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="dragoman-replicas-") as scratch:
        workdir = args.logs or scratch
        Path(workdir).mkdir(parents=True, exist_ok=True)
        for round_ in range(args.rounds):
            policies = args.policies.split(",")
            for policy in policies if round_ % 2 == 0 else reversed(policies):
                result = measure(policy, args, Path(workdir))
                results.append({"round": round_ + 1, **result})
                print(f"round {round_ + 1} {policy:<13} evaluated {result['evaluated']:>7.0f}  cached "
                      f"{result['cached']:>7.0f}  ttft p50 {result['ttft_p50']:>6.2f}s  mean {result['ttft_mean']:>6.2f}s  "
                      f"max {result['ttft_max']:>6.2f}s  "
                      f"({result['requests']} requests, {result['seconds']:.0f} s)", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "settings": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
