"""Every module imports on its own, first, in a fresh interpreter: an import cycle
that only the usual import order hides breaks tools, workers and plugins that
start elsewhere.

One interpreter loads the third-party libraries once, then forks a child per module (four at a time):
each child starts with no dragoman module loaded, as a fresh interpreter would, at a
fraction of the cost of starting ~250 interpreters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dragoman

ROOT = Path(dragoman.__file__).parent

# Run in a separate interpreter that has never imported dragoman. It prints one line
# per module that failed: "name<TAB>last line of the error".
CHILDREN = r"""
import importlib, os, sys, traceback
for lib in ("msgspec", "starlette.applications", "click", "prometheus_client", "uvicorn", "anyio",
            "redis.asyncio", "asyncpg", "jinja2", "opentelemetry.sdk.trace", "mcp"):
    try:
        importlib.import_module(lib)
    except Exception:
        pass
assert not any(name.split(".")[0] == "dragoman" for name in sys.modules)
def start(name):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc()[-500:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    return pid, name, os.fdopen(read, "rb")
waiting, running = list(reversed(sys.argv[1:])), {}
while waiting or running:
    while waiting and len(running) < 4:
        pid, name, pipe = start(waiting.pop())
        running[pid] = (name, pipe)
    pid, status = os.wait()
    name, pipe = running.pop(pid)
    error = pipe.read().decode(errors="replace")
    pipe.close()
    if status != 0:
        print(name, error.replace("\n", " | "), sep="\t")
"""


def modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # runs the CLI
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.heavy
def test_every_module_imports_first() -> None:
    names = modules()
    assert len(names) > 30
    done = subprocess.run([sys.executable, "-E", "-c", CHILDREN, *names], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""


@pytest.mark.heavy
def test_a_cycle_is_caught(tmp_path: Path) -> None:
    """The check itself: two modules importing each other's names fail in one order."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (package / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    done = subprocess.run(
        [sys.executable, "-E", "-c", CHILDREN, "cyclic.a", "cyclic.b"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    failed = sorted(line.split("\t")[0] for line in done.stdout.splitlines())  # children end in any order
    assert failed == ["cyclic.a", "cyclic.b"], done.stdout[-2000:] + done.stderr[-2000:]
