"""The benchmark's modules for the tests: bench/ is a directory of scripts that
import each other by name (run.py puts it on sys.path), not a package."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/`name`.py, imported as bench/run.py imports it."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)
