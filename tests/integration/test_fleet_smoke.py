"""bench/fleet.py (the simulated fleet) and its decision-cost cell run, so they never rot
(small and bounded: simulated seconds, no timing assertions)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_simulated_fleet_runs_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--replicas", "2", "--conversations", "6", "--gateways", "1,2",
         "--duration", "40", "--warmup", "10", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert {(c["policy"], c["gateways"]) for c in cells} == {
        (policy, gateways) for policy in ("round_robin", "least_loaded", "cache_aware") for gateways in (1, 2)
    }
    assert all(c["requests"] > 0 and 0 <= c["hit_rate"] <= 1 for c in cells)


def test_gateways_reading_the_replicas_own_load_with_other_clients_on_them(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--replicas", "4", "--conversations", "8", "--gateways", "2",
         "--duration", "40", "--warmup", "10", "--load-metrics", "0,1", "--outside", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert {(c["policy"], c["load_metrics"]) for c in cells} == {  # round robin reads nothing
        ("round_robin", 0.0),
        ("least_loaded", 0.0),
        ("cache_aware", 0.0),
        ("least_loaded", 1.0),
        ("cache_aware", 1.0),
    }
    assert all(c["requests"] > 0 for c in cells)


def test_the_decision_cost_cell_runs() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "fleet.py"), "--decision-cost"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "8 replicas:" in result.stdout and "32 replicas:" in result.stdout
