"""Every module imports on its own, first, in a fresh interpreter: an import cycle
that only the usual import order hides breaks tools, workers and plugins that
start elsewhere."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dragoman

ROOT = Path(dragoman.__file__).parent


def modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # runs the CLI
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_first() -> None:
    def load(name: str) -> tuple[str, int, str]:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60)
        return name, done.returncode, done.stderr[-500:]

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(name, err) for name, code, err in pool.map(load, modules()) if code != 0]
    assert len(modules()) > 30
    assert failed == []
