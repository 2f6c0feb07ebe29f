"""One command for the whole comparison, on one fake upstream, in one run.

Targets, each fed the same Anthropic request (shapes.py) unless said otherwise:

- `direct-openai`: the OpenAI twin of the request straight to the fake's
  /v1/chat/completions (the translating path's baseline);
- `direct-anthropic`: the Anthropic request straight to the fake's /v1/messages
  (the passthrough path's baseline);
- `translating`: `dragoman serve --upstream <fake>/v1`;
- `passthrough`: dragoman with an `protocol = "anthropic"` upstream;
- `limits-local`, `limits-redis`: `translating` with `[limits]` on (limits never reached), its
  buckets in the process or in Redis (REDIS_URL, else 127.0.0.1:6379; the cell is skipped when
  no Redis answers), measured in the json and stream100 cells: what a limit check costs;
- `litellm`: LiteLLM's proxy `/v1/messages`, one worker, the fake as an `openai/`
  model (installed on first use into its own venv under the cache directory);
- `ccr`: claude-code-router's gateway `/v1/messages`, the fake as an OpenAI-compatible
  provider (installed on first use under the cache directory, bench/ccr.py);
- `relay-floor`: the OpenAI twin through bench/relay.py, a zero-work byte pump
  (uvloop, no parsing) in front of the fake: not a gateway but the floor of CPU
  per streamed chunk for any Python relay, measured in the json and paced100
  cells only (for that figure) and shown beside the gateways' as a reference;
- `asgi-floor`: the Anthropic request through bench/asgi_floor.py, the least an
  ASGI proxy on dragoman's stack (uvicorn with httptools and uvloop, dragoman's
  own upstream connection pool) can do, in front of the fake's /v1/messages: the per-request
  and per-chunk floor of that stack, measured in the json, stream100 and paced100
  cells (not stream500) and shown beside the dragoman paths' as a reference.

Cases: tiny and claude-code shapes x non-streaming, streaming 100 and 500 tokens
(written at once) and 100 tokens 1 ms apart x concurrency 1 and 32. Cases run one
after another. Within a case the targets run in interleaved rounds (`--rounds N`,
default 2; 1 in smoke mode): A, B, C, ..., then A, B, C, ... again, each round a
window of `--duration / N` seconds (at least `max(10, concurrency) / N` replies,
at most `--max-window / N` s), after the `--warmup` in the first round and a brief
0.25 s one (and one finished reply per worker) in later rounds. A burst of noise
from other work on the machine then lands on every target of the cell, not on one.
A target's figures in a cell are over its rounds merged: latencies and times to
first token pooled before taking percentiles; replies, window seconds, text
deltas, CPU seconds and errors summed (CPU per request = total CPU / total
replies); RSS the last reading. LiteLLM is the exception: it runs once per cell,
in the last round, with the whole window and warm-up. Its replies take 15 ms to
seconds, so a burst of noise hardly moves its figures, while each extra round
would cost it a warm-up and a drain of a whole reply (at c=32 with streams,
several seconds each: about 75 s more per run). Then 1,000 idle streams are held
open through each dragoman path and CCR to read its memory cost. Gateways are pinned to
the last CPU and the load generator and fake upstream to the others (`--no-pin` to
let the scheduler place them).

    python bench/run.py                # full comparison (about 12 minutes)
    python bench/run.py --rounds 1     # each target once per cell, back to back
    python bench/run.py --smoke        # seconds; no LiteLLM unless --litellm, no CCR unless --ccr
    python bench/run.py --markdown docs/table.md --json results.json

Exits non-zero only when a request failed (or a server did not start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ccr  # noqa: E402
import load  # noqa: E402
import shapes  # noqa: E402
import team  # noqa: E402

LITELLM_VERSION = "1.106.12"  # newest whose [proxy] extra resolves from PyPI here (see docs/performance.md)
LITELLM_KEY = "sk-bench-master"
MODEL = "bench-model"
PACED_MODEL = "bench-model-paced"  # the fake sends its tokens 1 ms apart
SLOW_MODEL = "bench-model-slow"  # one token every 5 s: idle streams

# mode: (stream, max_tokens = tokens the fake sends, model)
MODES = {
    "json": (False, 100, MODEL),
    "stream100": (True, 100, MODEL),
    "stream500": (True, 500, MODEL),
    "paced100": (True, 100, PACED_MODEL),
}
RELAY = "relay-floor"  # bench/relay.py: the per-chunk CPU floor, not a gateway
FLOOR = "asgi-floor"  # bench/asgi_floor.py: the floor of dragoman's stack (uvicorn + its upstream pool), not a gateway
LIMITS, LIMITS_REDIS = "limits-local", "limits-redis"  # `translating` with [limits] on, in-process or in Redis
TEAM = team.TEAM  # `translating` with every team feature on (bench/team.py)
TARGETS = ("direct-openai", "direct-anthropic", RELAY, FLOOR, "translating", LIMITS, LIMITS_REDIS, TEAM, "passthrough",
           "litellm", "ccr")  # fmt: skip
BASELINE = {"translating": "direct-openai", "litellm": "direct-openai", "passthrough": "direct-anthropic", RELAY: "direct-openai",
            FLOOR: "direct-anthropic", "ccr": "direct-openai", LIMITS: "direct-openai", LIMITS_REDIS: "direct-openai",
            TEAM: "direct-openai"}  # fmt: skip
PEERS = {"litellm": "LiteLLM", "ccr": "CCR"}  # the other gateways: each gets a throughput and a latency column
IDLE_TARGETS = ("translating", "passthrough", "ccr")  # hold 1,000 idle streams open (LiteLLM is not measured)
LIMITS_MODES = ("json", "stream100")  # the cells of the limits' cost per request, and of the team target's
RELAY_MODES = ("json", "paced100")  # the cells of the paced CPU-per-chunk figure
FLOOR_MODES = ("json", "stream100", "paced100")  # stream500 skipped to save time
OPENAI_TARGETS = ("direct-openai", RELAY)  # sent the OpenAI twin of the request
LATER_WARMUP = 0.25  # seconds of warm-up in rounds after the first (the connections are new; the servers are warm)
SINGLE_ROUND = ("litellm",)  # measured once per cell (in the last round, whole window): slow replies, see above


def cache_dir() -> Path:
    if os.environ.get("DRAGOMAN_BENCH_CACHE"):
        return Path(os.environ["DRAGOMAN_BENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "dragoman-bench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- processes ---------------------------------------------------------------------


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    url: str  # where /v1/messages (or the fake's /v1) lives
    log_path: Path
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Processes:
    def __init__(self, workdir: Path, gateway_cpus: set[int] | None, client_cpus: set[int] | None) -> None:
        self.workdir = workdir
        self.gateway_cpus = gateway_cpus
        self.client_cpus = client_cpus
        self.started: list[Server] = []
        self.cleanups: list[Callable[[], None]] = []  # run once every server has stopped (a database dropped)

    def start(self, name: str, argv: list[str], url: str, *, gateway: bool, env: dict[str, str] | None = None,
              cwd: Path | None = None, headers: dict[str, str] | None = None) -> Server:  # fmt: skip
        log_path = self.workdir / f"{name}.log"
        cpus = self.gateway_cpus if gateway else self.client_cpus
        if gateway:  # its own usage database and files: not the user's, which other runs (an older
            # build's schema, a second bench) share; an A/B's builds then do the same work
            env = {"XDG_DATA_HOME": str(self.workdir / f"{name}-data"), **(env or {})}

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                cwd=cwd or self.workdir, preexec_fn=pin, start_new_session=True,
            )  # fmt: skip
        server = Server(name, process, url, log_path, headers or {})
        self.started.append(server)
        return server

    def stop_all(self) -> None:
        for server in reversed(self.started):
            if server.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for server in self.started:
            try:
                server.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(5)
        for server in self.started:  # what a server started (CCR's gateway) may outlive it
            _end_group(server.process.pid, deadline)
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as error:  # noqa: BLE001 - the others still run
                log(f"clean-up failed: {type(error).__name__}: {error}")
        self.cleanups.clear()


def _end_group(pgid: int, deadline: float) -> None:
    """Waits until no process of the group is left (they had SIGTERM), then SIGKILLs the rest."""
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(0.05)


def http(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_ready(server: Server, probe_body: bytes, timeout: float) -> None:
    """Until a real /v1/messages request (or the fake's model list) succeeds."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{server.tail()}")
        try:
            if server.name.startswith("fake"):
                status, data = http(server.url + "/models")
            else:
                status, data = http(server.url, probe_body, server.headers)
            if status == 200:
                return
            last = f"HTTP {status}: {data[:200]!r}"
        except OSError as error:
            last = str(error)
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout:.0f} s ({last}):\n{server.tail()}")


def start_on_a_free_port(procs: Processes, name: str, launch: Callable[[int], tuple[list[str], str]], probe_body: bytes, timeout: float,
                         **options: Any) -> Server:  # fmt: skip
    """`launch(port)` gives the argv and URL of a server on `port`, a free_port(); started and
    waited for (wait_ready). The port was free when picked, but another process (a test
    running beside the smoke run, say) may bind it first: a server that exits saying its
    address is in use is started again on another port."""
    for attempt in range(3):
        argv, url = launch(free_port())
        server = procs.start(name, argv, url, **options)
        try:
            wait_ready(server, probe_body, timeout)
            return server
        except RuntimeError:
            if attempt == 2 or server.process.poll() is None or "already in use" not in server.tail().lower():
                raise
            procs.started.remove(server)
            log(f"{name}: its port was taken before it bound it; starting it again on another")
    raise AssertionError("unreachable")


def start_fake(procs: Processes, slow_delay_ms: float, name: str = "fake") -> Server:
    def launch(port: int) -> tuple[list[str], str]:
        argv = [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port), "--tokens", "100000",
                "--paced-delay-ms", "1", "--slow-delay-ms", str(slow_delay_ms)]  # fmt: skip
        return argv, f"http://127.0.0.1:{port}/v1"

    return start_on_a_free_port(procs, name, launch, b"", 15, gateway=False)


def start_relay(procs: Processes, fake: Server) -> Server:
    """bench/relay.py in front of the fake, pinned like a gateway (it stands in for one)."""
    upstream_port = urllib.parse.urlsplit(fake.url).port

    def launch(port: int) -> tuple[list[str], str]:
        argv = [sys.executable, str(HERE / "relay.py"), "--port", str(port), "--upstream-port", str(upstream_port)]
        return argv, f"http://127.0.0.1:{port}/v1/chat/completions"

    return start_on_a_free_port(procs, RELAY, launch, shapes.openai_body("tiny", model=MODEL, max_tokens=5, stream=False), 15,
                                gateway=True, headers={"authorization": "Bearer sk-fake-upstream"})  # fmt: skip


def start_asgi_floor(procs: Processes, fake: Server) -> Server:
    """bench/asgi_floor.py in front of the fake's Anthropic-native /v1/messages, pinned like a gateway."""

    def launch(port: int) -> tuple[list[str], str]:
        argv = [
            sys.executable,
            str(HERE / "asgi_floor.py"),
            "--port",
            str(port),
            "--upstream",
            fake.url.removesuffix("/v1"),
        ]
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    return start_on_a_free_port(procs, FLOOR, launch, shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False), 15,
                                gateway=True, headers={"x-api-key": "bench", "anthropic-version": "2023-06-01"})  # fmt: skip


def start_translating(
    procs: Processes, fake: Server, name: str = "translating", env: dict[str, str] | None = None
) -> Server:
    def launch(port: int) -> tuple[list[str], str]:
        argv = [
            sys.executable,
            "-m",
            "dragoman",
            "serve",
            "--upstream",
            fake.url,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    return start_on_a_free_port(procs, name, launch, shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False), 30,
                                gateway=True, headers={"x-api-key": "bench", "anthropic-version": "2023-06-01"}, env=env)  # fmt: skip


class Skipped(Exception):
    """A target this machine cannot run (no Redis for `limits-redis`): left out, not a failure."""


def redis_url() -> str:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping()
    except (redis.RedisError, OSError) as error:
        raise Skipped(f"no Redis answers at {url} ({type(error).__name__}); set REDIS_URL") from None
    return url


def start_limited(procs: Processes, fake: Server, name: str, env: dict[str, str] | None = None) -> Server:
    """`translating` with [limits] too large to be reached: every request is checked and settled
    (in Redis when `name` starts with limits-redis)."""
    store = (
        f'redis_url = "{redis_url()}"\nredis_prefix = "dragoman-bench:{os.getpid()}:{name}:"\n'
        if name.startswith(LIMITS_REDIS)
        else ""
    )
    config = procs.workdir / f"{name}.toml"
    config.write_text(
        '[server]\nlog_level = "warning"\n\n[limits]\nrequests_per_minute = 1000000000\n'
        "input_tokens_per_minute = 1000000000000\noutput_tokens_per_minute = 1000000000000\n" + store
        + f'\n[upstreams.default]\nurl = "{fake.url}"\n'
    )  # fmt: skip

    def launch(port: int) -> tuple[list[str], str]:
        argv = [sys.executable, "-m", "dragoman", "serve", "--config", str(config), "--port", str(port)]
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    return start_on_a_free_port(procs, name, launch, shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False), 30,
                                gateway=True, headers={"x-api-key": "bench", "anthropic-version": "2023-06-01"}, env=env)  # fmt: skip


def start_team(procs: Processes, fake: Server, name: str = TEAM, env: dict[str, str] | None = None,
               keys: int = team.KEYS, command: list[str] | None = None) -> Server:  # fmt: skip
    """`translating` with every team feature on (bench/team.py): `keys` keys in a private
    PostgreSQL database, dropped with the Redis keys once the gateway stops. `command`: what
    runs in place of `python -m dragoman` (bench/tail_hook.py)."""
    started = time.monotonic()
    try:
        made = team.setup(name, keys, redis_url())
    except team.Unavailable as why:
        raise Skipped(str(why)) from None
    procs.cleanups.append(made.cleanup)
    log(f"{name}: {keys:,} keys in {made.database}, seeded in {time.monotonic() - started:.1f} s")
    second = start_fake(procs, slow_delay_ms=5000, name=f"fake-{name}")  # the second replica
    config = procs.workdir / f"{name}.toml"
    config.write_text(made.config(procs.workdir, fake.url, second.url, (MODEL, PACED_MODEL, SLOW_MODEL)))

    def launch(port: int) -> tuple[list[str], str]:
        argv = [*(command or [sys.executable, "-m", "dragoman"]), "serve", "--config", str(config), "--port", str(port)]
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    probe = shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False)
    return start_on_a_free_port(procs, name, launch, probe, 90, gateway=True, headers=made.headers, env=env)


def start_passthrough(
    procs: Processes, fake: Server, *, name: str = "passthrough", env: dict[str, str] | None = None
) -> Server:
    config = procs.workdir / f"{name}.toml"
    config.write_text(
        '[server]\nlog_level = "warning"\n\n'
        f'[upstreams.fake]\nurl = "{fake.url.removesuffix("/v1")}"\nprotocol = "anthropic"\n\n'
        + "".join(f'[[models]]\nname = "{m}"\nupstream = "fake"\n\n' for m in (MODEL, PACED_MODEL, SLOW_MODEL))
    )

    def launch(port: int) -> tuple[list[str], str]:
        argv = [sys.executable, "-m", "dragoman", "serve", "--config", str(config), "--port", str(port)]
        return argv, f"http://127.0.0.1:{port}/v1/messages"

    return start_on_a_free_port(procs, name, launch, shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False), 30,
                                gateway=True, env=env, headers={"x-api-key": "bench", "anthropic-version": "2023-06-01"})  # fmt: skip


def litellm_executable() -> Path:
    """The LiteLLM proxy CLI in its own venv, installed on first use (a marker file
    names the installed version; a venv cannot be moved, so it is built in place)."""
    import fcntl

    venv = cache_dir() / "litellm-venv"
    exe, marker = venv / "bin" / "litellm", venv / ".dragoman-bench-installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "litellm-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs wait for one install
        if exe.exists() and marker.exists() and marker.read_text().strip() == LITELLM_VERSION:
            return exe
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
        shutil.rmtree(venv, ignore_errors=True)
        log(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once; about a minute)")
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], capture_output=True, text=True)
        if done.returncode != 0 or not exe.exists():
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(f"pip install litellm[proxy]=={LITELLM_VERSION} failed:\n{done.stderr.strip()[-2000:]}")
        marker.write_text(LITELLM_VERSION + "\n")
        return exe


def start_litellm(procs: Processes, fake: Server) -> Server:
    exe = litellm_executable()
    port = free_port()
    config = procs.workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        + "".join(
            f"  - model_name: {m}\n    litellm_params:\n      model: openai/{m}\n      api_base: {fake.url}\n      api_key: sk-fake-upstream\n"
            for m in (MODEL, PACED_MODEL)
        )
        + "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
        "litellm_settings:\n"
        "  use_chat_completions_url_for_anthropic_messages: true\n"
    )
    argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    # The local cost map keeps it from fetching one from the internet at startup.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    server = procs.start("litellm", argv, f"http://127.0.0.1:{port}/v1/messages", gateway=True, env=env,
                         headers={"x-api-key": LITELLM_KEY, "anthropic-version": "2023-06-01"})  # fmt: skip
    wait_ready(server, shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False), 120)
    return server


def start_ccr(procs: Processes, fake: Server) -> Server:
    """claude-code-router (bench/ccr.py) with a fresh home: its gateway on the port
    picked here, its management service on another."""
    found = ccr.install(cache_dir(), log)
    home = procs.workdir / "ccr-home"

    def launch(port: int) -> tuple[list[str], str]:
        shutil.rmtree(home, ignore_errors=True)  # config.json is imported on the first start only
        ccr.write_home(home, port, fake.url, (MODEL, PACED_MODEL, SLOW_MODEL))
        return ccr.argv(found, free_port()), f"http://127.0.0.1:{port}/v1/messages"

    probe = shapes.anthropic_body("tiny", model=MODEL, max_tokens=5, stream=False)
    headers = {"x-api-key": ccr.CCR_KEY, "anthropic-version": "2023-06-01"}
    return start_on_a_free_port(
        procs, "ccr", launch, probe, 90, gateway=True, env=ccr.environment(found, home), headers=headers
    )


# -- measurement -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    shape: str
    mode: str
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.shape} {self.mode} c={self.concurrency}"


def cases(smoke: bool) -> list[Case]:
    concurrencies = (1, 4) if smoke else (1, 32)
    return [Case(shape, mode, c) for shape in shapes.SHAPES for mode in MODES for c in concurrencies]


async def measure(target: str, server: Server, fake: Server, case: Case, args: argparse.Namespace, *, rounds: int = 1,
                  first: bool = True) -> load.Result:  # fmt: skip
    """One round of one target in one cell, of `rounds` for that target: a window of
    `duration / rounds` seconds, after the whole warm-up if it is the `first`."""
    stream, tokens, model = MODES[case.mode]
    if args.smoke and model == PACED_MODEL:
        tokens = 10  # 10 ms streams: the smoke run stays short
    openai = target in OPENAI_TARGETS
    make = shapes.openai_body if openai else shapes.anthropic_body
    body = make(case.shape, model=model, max_tokens=tokens, stream=stream)
    if target.startswith("direct"):
        url = fake.url + ("/chat/completions" if openai else "/messages")
        headers = (
            {"authorization": "Bearer sk-fake-upstream"}
            if openai
            else {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
        )
        pid = None
    else:
        url, headers, pid = server.url, server.headers, server.pid
    expect = None if openai or stream else upstream_text(fake, body)
    if args.smoke:
        return await load.run_load(url, body, headers=headers, concurrency=case.concurrency, duration=10, max_requests=args.smoke_requests,
                                   warmup=0, stream=stream, openai=openai, pid=pid, upstream_pid=fake.pid, drain_timeout=30,
                                   expect_text=expect, chunks=tokens if stream else None)  # fmt: skip
    warmup = args.warmup if first else min(args.warmup, LATER_WARMUP)
    min_requests = -(-max(10, case.concurrency) // rounds)  # the cell's minimum, shared out over the rounds
    return await load.run_load(url, body, headers=headers, concurrency=case.concurrency, duration=args.duration / rounds, warmup=warmup,
                               min_requests=min_requests, max_window=args.max_window / rounds, stream=stream, openai=openai,
                               pid=pid, upstream_pid=fake.pid, drain_timeout=120, expect_text=expect,
                               chunks=tokens if stream else None)  # fmt: skip


_UPSTREAM_TEXT: dict[bytes, str] = {}


def upstream_text(fake: Server, body: bytes) -> str:
    """The text of the fake's own non-streamed Anthropic reply to `body`: what a
    gateway's reply should carry (asked once per request body)."""
    if body not in _UPSTREAM_TEXT:
        status, data = http(fake.url + "/messages", body, {"x-api-key": "bench", "anthropic-version": "2023-06-01"})
        if status != 200:
            raise RuntimeError(f"the fake answered {status}: {data[:200]!r}")
        blocks = msgspec.json.decode(data)["content"]
        _UPSTREAM_TEXT[body] = "".join(b["text"] for b in blocks if b["type"] == "text")
    return _UPSTREAM_TEXT[body]


def merge(rounds: list[load.Result]) -> load.Result:
    """A target's figures in a cell over all its rounds: samples pooled (percentiles
    over all of them), counts, windows and CPU seconds summed, RSS the last reading."""
    if len(rounds) == 1:
        return rounds[0]
    merged = load.Result()
    for r in rounds:
        merged.requests += r.requests
        merged.errors += r.errors
        merged.first_error = merged.first_error or r.first_error
        merged.window += r.window
        merged.latency.extend(r.latency)
        merged.ttft.extend(r.ttft)
        merged.deltas += r.deltas
        for kind, count in r.differences.items():
            merged.differences[kind] = merged.differences.get(kind, 0) + count
        merged.client_cpu += r.client_cpu
    cpus = [r.cpu for r in rounds]
    merged.cpu = None if None in cpus else sum(c for c in cpus if c is not None)
    waits = [r.sleeps for r in rounds]
    merged.sleeps = None if None in waits else sum(w for w in waits if w is not None)
    upstream = [r.upstream_cpu for r in rounds]
    merged.upstream_cpu = None if None in upstream else sum(u for u in upstream if u is not None)
    merged.rss_before, merged.rss_after = rounds[0].rss_before, rounds[-1].rss_after
    return merged


async def idle_streams(server: Server, count: int) -> dict[str, Any]:
    body = shapes.anthropic_body("tiny", model=SLOW_MODEL, max_tokens=1000, stream=True)
    return await load.hold_streams(server.url, body, headers=server.headers, count=count, pid=server.pid)


# -- the table ---------------------------------------------------------------------


def _f(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"


def _added(result: load.Result, base: load.Result | None, p: float, ttft: bool = False) -> float | None:
    """The target's percentile less its baseline's in the same cell."""
    return result.ms(p, ttft) - base.ms(p, ttft) if base is not None else None


def table(results: dict[tuple[Case, str], load.Result], order: list[Case], targets: list[str]) -> str:
    peers = "".join(f" × {name} req/s | {name} +p50 ÷ ours |" for name in PEERS.values())
    head = ("| case | target | req/s | p50 ms | p90 ms | p99 ms | TTFT p50 ms | +p50 ms | +p99 ms | +TTFT p50 ms "
            "| CPU ms/req | CPU µs/chunk | RSS MB |" + peers)  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for case in order:
        for target in targets:
            result = results.get((case, target))
            if result is None:
                continue
            stream = bool(result.ttft)
            base = results.get((case, BASELINE.get(target, "")))
            plus50 = _added(result, base, 50)
            row = [
                case.label, target, _f(result.throughput, 0), _f(result.ms(50)), _f(result.ms(90)), _f(result.ms(99)),
                _f(result.ms(50, True)) if stream else "-", _f(plus50), _f(_added(result, base, 99)),
                _f(_added(result, base, 50, True)) if stream else "-",
                _f(result.cpu_per_request_ms, 3) if result.cpu is not None else "-",
                _f(result.cpu_per_delta_us, 1) if result.cpu is not None and stream else "-",
                _f(result.rss_after / 2**20, 0) if result.rss_after else "-",
            ]  # fmt: skip
            for peer in PEERS:
                row += _against(results, case, target, peer, result.throughput, plus50)
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _against(results: dict[tuple[Case, str], load.Result], case: Case, target: str, peer: str, throughput: float,
             plus50: float | None) -> list[str]:  # fmt: skip
    """A dragoman path's row against a peer in the same cell: its throughput ÷ the
    peer's, and the peer's added p50 ÷ its own."""
    other = results.get((case, peer))
    if other is None or target not in ("translating", "passthrough") or not other.throughput:
        return ["-", "-"]
    vs_added = None
    other_added = _added(other, results.get((case, BASELINE[peer])), 50)
    if other_added is not None and plus50 is not None and plus50 > 0:
        vs_added = other_added / plus50
    return [_f(throughput / other.throughput, 1) + "×", _f(vs_added, 1) + "×" if vs_added else "-"]


def differences(results: dict[tuple[Case, str], load.Result], targets: list[str]) -> list[str]:
    """Each gateway's replies that passed but differ from Anthropic's format
    (load.DIFFERENCES), summed over its cells, each kind out of the replies it is
    checked in: all for the head and the message id, the non-streamed ones for the
    text, the streamed ones for a stream's opening."""
    out = []
    for target in targets:
        if target.startswith("direct") or target in (RELAY, FLOOR):
            continue  # not gateways: the fake, and the floors that relay its replies
        cells = [r for (_, t), r in results.items() if t == target]
        replies, streamed = sum(r.requests for r in cells), sum(r.requests for r in cells if r.ttft)
        found = [(kind, sum(r.differences.get(kind, 0) for r in cells)) for kind in load.DIFFERENCES]
        checked = {load.REQUEST_ID: replies, load.ID: replies, load.TEXT: replies - streamed}
        parts = [f"{kind} in {n:,} of {checked.get(kind, streamed):,}" for kind, n in found if n]
        out.append(
            f"- {target}: {'; '.join(parts) if parts else 'none'} ({replies:,} replies, {streamed:,} of them streamed)"
        )
    return out


def target_checks(results: dict[tuple[Case, str], load.Result], idle: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's targets, each as met / MISSED with the measured figure."""
    out: list[str] = []

    def get(shape: str, mode: str, c: int, target: str) -> load.Result | None:
        return results.get((Case(shape, mode, c), target))

    def added(shape: str, mode: str, c: int, target: str, p: float, ttft: bool = False) -> float | None:
        r, b = get(shape, mode, c, target), get(shape, mode, c, BASELINE[target])
        return None if r is None or b is None else r.ms(p, ttft) - b.ms(p, ttft)

    def paced_per_chunk(shape: str, c: int, target: str) -> float | None:
        """CPU µs per chunk when tokens arrive 1 ms apart: paced100 against json, ÷ 100."""
        paced, whole = get(shape, "paced100", c, target), get(shape, "json", c, target)
        if not paced or not whole or paced.cpu_per_request_ms is None or whole.cpu_per_request_ms is None:
            return None
        return (paced.cpu_per_request_ms - whole.cpu_per_request_ms) * 1000 / 100

    def check(label: str, value: float | None, limit: float, unit: str, *, at_least: bool = False) -> bool:
        """Prints the check; False when it was not measured in this run."""
        if value is None:
            return False
        ok = value >= limit if at_least else value <= limit
        sign = "≥" if at_least else "≤"
        out.append(f"- {'met' if ok else '**MISSED**'}: {label}: {value:,.2f} {unit} (target {sign} {limit:g} {unit})")
        return True

    def floor_reference(shape: str, mode: str, ttft: bool = False) -> None:
        """Under a check at c=1: the same figure for bench/asgi_floor.py (the stack's
        floor) and for both dragoman paths, with CPU per request."""
        floor, floor_added = get(shape, mode, 1, FLOOR), added(shape, mode, 1, FLOOR, 50, ttft)
        if floor is None or floor_added is None or floor.cpu_per_request_ms is None:
            return
        what = "added time to first token p50" if ttft else "added p50"
        parts = []
        for target in ("passthrough", "translating"):
            r, a = get(shape, mode, 1, target), added(shape, mode, 1, target, 50, ttft)
            if r is not None and a is not None and r.cpu_per_request_ms is not None:
                parts.append(f"{target} {a:,.2f} ms / {r.cpu_per_request_ms:,.3f} ms/req")
        out.append(f"  - reference, not a target: stack floor (bench/asgi_floor.py), {shape} {mode} c=1: "
                   f"{what} {floor_added:,.2f} ms, CPU {floor.cpu_per_request_ms:,.3f} ms/req"
                   + (" — " + ", ".join(parts) if parts else ""))  # fmt: skip

    for target in ("translating", "passthrough"):
        # Under each of the passthrough's added-p50 checks: the stack's floor (bench/asgi_floor.py).
        under = target == "passthrough"
        if check(f"{target}, tiny, c=1, added p50", added("tiny", "json", 1, target, 50), 0.5, "ms") and under:
            floor_reference("tiny", "json")
        check(f"{target}, tiny, c=1, added p99", added("tiny", "json", 1, target, 99), 1, "ms")
        if (
            check(f"{target}, claude-code, c=1, added p50", added("claude-code", "json", 1, target, 50), 2, "ms")
            and under
        ):
            floor_reference("claude-code", "json")
        for shape in shapes.SHAPES:
            if (
                check(
                    f"{target}, {shape}, stream 100, c=1, added time to last byte (p50)",
                    added(shape, "stream100", 1, target, 50),
                    2,
                    "ms",
                )
                and under
            ):
                floor_reference(shape, "stream100")
            if check(f"{target}, {shape}, stream 100, c=1, added time to first token (p50)",
                     added(shape, "stream100", 1, target, 50, True), 1, "ms") and under:  # fmt: skip
                floor_reference(shape, "stream100", ttft=True)
            # The issue's own measure: its 100-token stream at c=1 from the fake (tokens as fast
            # as it writes them), CPU per request ÷ chunks, as its LiteLLM figure of ~0.5 ms per
            # chunk is that stream's CPU ÷ 100. Then two stricter ones: the marginal CPU of a
            # chunk, 400 more chunks (500 against 100 tokens) ...
            streamed = get(shape, "stream100", 1, target)
            all_in = streamed.cpu_per_delta_us if streamed is not None and streamed.cpu is not None else None
            check(f"{target}, {shape}, stream 100, c=1, CPU per streamed chunk (the issue's measure: CPU per request ÷ chunks)",
                  all_in, 15, "µs")  # fmt: skip
            long, short = get(shape, "stream500", 1, target), get(shape, "stream100", 1, target)
            marginal = None
            if long and short and long.cpu_per_request_ms is not None and short.cpu_per_request_ms is not None:
                marginal = (long.cpu_per_request_ms - short.cpu_per_request_ms) * 1000 / 400
            check(
                f"{target}, {shape}, c=1, CPU per streamed chunk (marginal: 500 vs 100 tokens, bursts)",
                marginal,
                15,
                "µs",
            )
            # ... and when tokens arrive one by one (1 ms apart, as from a model: stricter than
            # the issue asks), each chunk pays a whole read-translate-write trip: against the
            # same reply unstreamed.
            # The floor beside it: a byte pump (bench/relay.py) in the same cell.
            for c in (1, 32):
                per_chunk = paced_per_chunk(shape, c, target)
                check(f"{target}, {shape}, c={c}, CPU per streamed chunk (stricter: tokens 1 ms apart, beyond the unstreamed reply)",
                      per_chunk, 15, "µs")  # fmt: skip
                floor = paced_per_chunk(shape, c, RELAY)
                if per_chunk is not None and floor is not None:
                    out.append(f"  - reference, not a target: zero-work byte pump (bench/relay.py), {shape}, c={c}, "
                               f"CPU per streamed chunk (tokens 1 ms apart): {floor:,.2f} µs — the floor for a Python relay")  # fmt: skip
                stack = paced_per_chunk(shape, c, FLOOR)
                if per_chunk is not None and stack is not None:
                    out.append(f"  - reference, not a target: stack floor (bench/asgi_floor.py), {shape}, c={c}, "
                               f"CPU per streamed chunk (tokens 1 ms apart): {stack:,.2f} µs — the floor of dragoman's stack")  # fmt: skip
        for shape in shapes.SHAPES:
            for mode, factor in (("json", 10), ("stream100", 20)):
                r, lite = get(shape, mode, 32, target), get(shape, mode, 32, "litellm")
                ratio = r.throughput / lite.throughput if r and lite and lite.throughput else None
                check(f"{target}, {shape}, {mode}, c=32, throughput vs LiteLLM", ratio, factor, "×", at_least=True)
        if target in idle:
            figures = idle[target]
            check(f"{target}, {figures['streams']} idle streams, added memory", figures["added_mb"], 50, "MB")
    for shape in shapes.SHAPES:
        for mode in LIMITS_MODES:
            plain, limited, shared = (get(shape, mode, 1, t) for t in ("translating", LIMITS, LIMITS_REDIS))
            check(f"limits in-process, {shape} {mode} c=1, CPU per request beyond translating",
                  _cpu_beyond(limited, plain), 30, "µs")  # fmt: skip
            if (shared_cost := _cpu_beyond(shared, plain)) is not None:
                more = added(shape, mode, 1, LIMITS_REDIS, 50)
                base = added(shape, mode, 1, "translating", 50)
                out.append(f"  - reference, not a target: limits in Redis, {shape} {mode} c=1: CPU per request beyond "
                           f"translating {shared_cost:,.1f} µs; p50 beyond translating "
                           f"{(more - base) if more is not None and base is not None else float('nan'):,.3f} ms (one round trip to Redis)")  # fmt: skip
    # Issue 36: the default configuration's tail, and every team feature at once (bench/team.py).
    for target, p50, p99 in (("translating", 0.40, 0.90), (TEAM, 0.60, 1.2)):
        check(f"{target}, tiny, c=1, added p50 (issue 36)", added("tiny", "json", 1, target, 50), p50, "ms")
        check(f"{target}, tiny, c=1, added p99 (issue 36)", added("tiny", "json", 1, target, 99), p99, "ms")
    teamed = get("tiny", "json", 1, TEAM)
    check("team, tiny, c=1, CPU per request (issue 36)", teamed.cpu_per_request_ms if teamed else None, 0.5, "ms")
    for shape, mode in (("tiny", "json"), ("claude-code", "json"), ("tiny", "stream100"), ("claude-code", "stream100")):
        t, p = added(shape, mode, 1, "translating", 50), added(shape, mode, 1, "passthrough", 50)
        share = p / t if t and p is not None and t > 0 else None
        if check(f"passthrough/translating added p50, {shape} {mode} c=1", share, 0.5, "×"):
            floor_reference(shape, mode)
    return out


def _cpu_beyond(result: load.Result | None, base: load.Result | None) -> float | None:
    """µs of CPU per request that `result` spent beyond `base`."""
    if result is None or base is None or result.cpu_per_request_ms is None or base.cpu_per_request_ms is None:
        return None
    return (result.cpu_per_request_ms - base.cpu_per_request_ms) * 1000


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / load.CLK_TCK


def ours_seconds(procs: Processes) -> float:
    """CPU seconds of this process and every server it started."""
    return load.self_cpu() + sum(load.cpu_seconds(s.pid) for s in procs.started if s.process.poll() is None)


def revision() -> str:
    root = HERE.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes in src/' if dirty else ''}" if head else "unknown"


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    return f"{os.cpu_count()} CPUs ({model}){mem}, Linux {platform.release()}, Python {platform.python_version()}"


# -- main ----------------------------------------------------------------------------


def wait_quiet(limit: float, threshold: float = 0.15) -> float:
    """Waits (up to `limit` seconds) for a second in which the machine is at most
    `threshold` busy; returns the busy fraction last seen."""
    deadline = time.monotonic() + limit
    cpus = os.cpu_count() or 1
    while True:
        before = busy_seconds()
        time.sleep(1.0)
        busy = (busy_seconds() - before) / cpus
        if busy <= threshold or time.monotonic() >= deadline:
            return busy
        log(f"machine {busy * 100:.0f}% busy with other work; waiting for quiet")


async def run(args: argparse.Namespace, procs: Processes) -> int:
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    t_start = time.monotonic()
    busy_start = busy_seconds()
    fake = start_fake(procs, slow_delay_ms=5000)
    servers: dict[str, Server] = {"direct-openai": fake, "direct-anthropic": fake}
    failed = False
    wanted = [t for t in TARGETS if t in args.targets]
    starters = ((RELAY, start_relay), (FLOOR, start_asgi_floor), ("translating", start_translating),
                (LIMITS, lambda p, f: start_limited(p, f, LIMITS)), (LIMITS_REDIS, lambda p, f: start_limited(p, f, LIMITS_REDIS)),
                (TEAM, lambda p, f: start_team(p, f, keys=args.team_keys)),
                ("passthrough", start_passthrough), ("litellm", start_litellm), ("ccr", start_ccr))  # fmt: skip
    for name, starter in starters:
        if name not in wanted or (name == "litellm" and not args.litellm) or (name == "ccr" and not args.ccr):
            continue
        try:
            servers[name] = starter(procs, fake)
        except Skipped as why:
            log(f"{name}: left out: {why}")
        except Exception as error:  # noqa: BLE001 - report, measure the others, exit non-zero
            log(f"{name}: could not start: {error}")
            failed = True
    targets = [t for t in wanted if t in servers]
    log(
        f"servers up in {time.monotonic() - t_start:.1f} s: {', '.join(f'{n} pid {s.pid}' for n, s in servers.items() if not n.startswith('direct'))}"
    )

    if not args.smoke:
        # A server just started runs its first requests slower (imports, caches, the
        # allocator): a second of each shape before the first cell, so that cell is not
        # the one to pay for it.
        for target in targets:
            if target.startswith("direct") or target in SINGLE_ROUND:
                continue
            for shape in shapes.SHAPES:
                await measure(
                    target, servers[target], fake, Case(shape, "json", 4), args, rounds=max(1, int(args.duration))
                )
        log("servers warmed up")

    results: dict[tuple[Case, str], load.Result] = {}
    by_round: dict[
        tuple[Case, str], list[load.Result]
    ] = {}  # when more than one round: each round's own figures (JSON)
    order = [c for c in cases(args.smoke) if c.shape in args.shapes and c.mode in args.modes]
    for case in order:
        cell = [t for t in targets
                if not ((t == RELAY and case.mode not in RELAY_MODES) or (t == FLOOR and case.mode not in FLOOR_MODES)
                        or (t in (LIMITS, LIMITS_REDIS, TEAM) and case.mode not in LIMITS_MODES))]  # fmt: skip
        rounds: dict[str, list[load.Result]] = {t: [] for t in cell}
        spent = dict.fromkeys(cell, 0.0)
        for round_ in range(args.rounds):  # A, B, C, ..., then A, B, C, ... again
            for target in cell:
                own = 1 if target in SINGLE_ROUND else args.rounds  # a single-round target runs in the last round
                if round_ < args.rounds - own:
                    continue
                t0 = time.monotonic()
                result = await measure(
                    target, servers[target], fake, case, args, rounds=own, first=round_ == args.rounds - own
                )
                rounds[target].append(result)
                spent[target] += time.monotonic() - t0
        for target in cell:
            result = results[(case, target)] = merge(rounds[target])
            if len(rounds[target]) > 1:
                by_round[(case, target)] = rounds[target]
            extra = f", ttft p50 {result.ms(50, True):.2f} ms" if result.ttft else ""
            cpu = f", cpu {result.cpu_per_request_ms:.3f} ms/req" if result.cpu_per_request_ms is not None else ""
            each = ""
            if len(rounds[target]) > 1:
                each = "  p50 by round " + "/".join(f"{r.ms(50):.2f}" for r in rounds[target])
            log(f"{case.label:28} {target:17} {result.throughput:9.1f} req/s  p50 {result.ms(50):8.2f} ms  "
                f"p99 {result.ms(99):8.2f} ms{extra}{cpu}  [{result.requests} in {result.window:.1f} s; {spent[target]:.1f} s]{each}")  # fmt: skip
            if result.errors:
                failed = True
                log(f"  {result.errors} FAILED: {result.first_error}")

    idle: dict[str, dict[str, Any]] = {}
    if args.idle_streams:
        for target in IDLE_TARGETS:
            if target in servers and target in targets:
                figures = await idle_streams(servers[target], args.idle_streams)
                idle[target] = figures
                log(f"idle streams via {target}: {figures}")
                if figures["errors"]:
                    failed = True

    elapsed = time.monotonic() - t_start
    # CPU time that other processes on the machine took during the run: noise.
    foreign = max(0.0, busy_seconds() - busy_start - ours_seconds(procs))
    text = [
        f"dragoman benchmark — {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {machine()}",
        f"dragoman {revision()}; LiteLLM {LITELLM_VERSION if 'litellm' in targets else 'not run'}; "
        f"claude-code-router {ccr.CCR_VERSION if 'ccr' in targets else 'not run'}; "
        f"other processes used {foreign:.1f} CPU-s during the run ({foreign / elapsed * 100:.0f}% of one CPU)",
        f"mode: {'smoke' if args.smoke else 'full'}; {windows(args, targets)}; "
        f"gateways {'pinned to CPU ' + ','.join(map(str, sorted(procs.gateway_cpus))) if procs.gateway_cpus else 'not pinned'}; "
        f"total {elapsed:.0f} s",
        "",
        table(results, order, targets),
    ]
    if idle:
        text += [
            "",
            "| idle streams | streams | RSS before MB | RSS with streams open MB | added MB | opened in s |",
            "|---|---|---|---|---|---|",
        ]
        text += [
            f"| {t} | {f['streams']} | {f['rss_before_mb']} | {f['rss_open_mb']} | {f['added_mb']} | {f['open_s']} |"
            for t, f in idle.items()
        ]
    text += ["", "Replies that differ from Anthropic's format (counted, not failed):", *differences(results, targets)]
    if not args.smoke:
        text += ["", "Targets (issue 8):", *target_checks(results, idle)]
    report = "\n".join(text)
    print(report, flush=True)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    if args.json:
        raw = {
            "machine": machine(),
            "rounds": args.rounds,
            "cells": [cell_figures(c, t, r, by_round.get((c, t))) for (c, t), r in results.items()],
            "idle_streams": idle,
        }
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(raw), indent=1))
    log(f"done in {elapsed:.1f} s{'; SOME REQUESTS FAILED' if failed else ''}")
    return 1 if failed else 0


def cell_figures(case: Case, target: str, merged: load.Result, rounds: list[load.Result] | None) -> dict[str, Any]:
    """A cell of the JSON: the merged figures, and each round's when there were several."""
    out = {"case": case.label, "target": target, **merged.summary()}
    if rounds:
        out["by_round"] = [r.summary() for r in rounds]
    return out


def windows(args: argparse.Namespace, targets: list[str]) -> str:
    """The header's account of the measurement windows."""
    if args.smoke:
        return f"{args.smoke_requests} requests per cell{f' in each of {args.rounds} interleaved rounds' if args.rounds > 1 else ''}, no warm-up"
    if args.rounds == 1:
        return f"window ≥ {args.duration:g} s per cell after a ≥ {args.warmup:g} s warm-up, targets back to back"
    single = [t for t in SINGLE_ROUND if t in targets]
    return (f"window ≥ {args.duration:g} s per cell in {args.rounds} interleaved rounds of ≥ {args.duration / args.rounds:g} s, "
            f"after a ≥ {args.warmup:g} s warm-up in the first and {min(args.warmup, LATER_WARMUP):g} s in the others"
            + (f" ({', '.join(single)}: once per cell, in the last round, whole window and warm-up)" if single else ""))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="dragoman vs the direct call vs LiteLLM and claude-code-router, on one fake upstream."
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few requests per cell, concurrency 1 and 4, no LiteLLM or CCR"
    )
    parser.add_argument("--smoke-requests", type=int, default=4, help="requests per cell in smoke mode")
    parser.add_argument("--litellm", action=argparse.BooleanOptionalAction, default=None,
                        help="include LiteLLM (default: yes, except in smoke mode)")  # fmt: skip
    parser.add_argument("--ccr", action=argparse.BooleanOptionalAction, default=None,
                        help="include claude-code-router (default: yes, except in smoke mode)")  # fmt: skip
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of measurement per cell (at least)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per cell (at least)")
    parser.add_argument("--max-window", type=float, default=40.0, help="longest measurement window of a cell")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per cell: the cell's targets run A, B, C, ... N times, each round a window of "
                             f"DURATION/N s (warm-up --warmup in the first round, {LATER_WARMUP:g} s in the others), figures over "
                             "all rounds merged (default 2; smoke 1, where each round sends --smoke-requests); "
                             "LiteLLM runs once per cell, in the last round, with the whole window")  # fmt: skip
    parser.add_argument(
        "--idle-streams", type=int, default=None, help="idle streams to hold open (default 1000; smoke 20; 0 skips)"
    )
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of: " + ", ".join(TARGETS))
    parser.add_argument("--team-keys", type=int, default=None,
                        help=f"keys in the team target's database (default {team.KEYS:,}; smoke 1,000)")  # fmt: skip
    parser.add_argument("--shapes", default=",".join(shapes.SHAPES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--wait-quiet", type=float, default=None,
                        help="wait up to this many seconds for other work on the machine to stop (default 60; smoke 0)")  # fmt: skip
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=True, help="pin gateways to the last CPU"
    )
    parser.add_argument("--markdown", help="also write the report here")
    parser.add_argument(
        "--json", help="write the raw figures here (merged over the rounds, and each round's under by_round)"
    )
    args = parser.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.litellm is None:
        args.litellm = not args.smoke
    if args.ccr is None:
        args.ccr = not args.smoke
    if args.wait_quiet is None:
        args.wait_quiet = 0 if args.smoke else 60
    if args.idle_streams is None:
        args.idle_streams = 20 if args.smoke else 1000
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 2
    if args.team_keys is None:
        args.team_keys = 1000 if args.smoke else team.KEYS
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpus = client_cpus = None
    if args.pin and len(cpus) >= 2:
        gateway_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1])
        os.sched_setaffinity(0, client_cpus)
    with tempfile.TemporaryDirectory(prefix="dragoman-bench-") as workdir:
        procs = Processes(Path(workdir), gateway_cpus, client_cpus)
        try:
            try:
                import uvloop

                return uvloop.run(run(args, procs))
            except ImportError:
                return asyncio.run(run(args, procs))
        except RuntimeError as error:
            log(f"error: {error}")
            return 2
        finally:
            procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
