"""The benchmark's smoke mode, so bench/ never rots (no timing assertions)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_runs_every_path_without_a_failed_request():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--no-litellm", "--no-pin", "--wait-quiet", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "translating" in result.stdout and "passthrough" in result.stdout
    assert "relay-floor" in result.stdout  # the per-chunk CPU floor (bench/relay.py)
    assert "asgi-floor" in result.stdout  # the floor of uvicorn + aiohttp (bench/asgi_floor.py)
