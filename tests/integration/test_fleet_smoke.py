"""bench/fleet.py (the simulated fleet) and its decision-cost cell run, so they never rot
(small and bounded: simulated seconds, no timing assertions)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bench import bench_module

pytestmark = pytest.mark.heavy  # whole simulated fleets: the full suite runs them, --fast leaves them out

fleet = bench_module("fleet")
fleet_floor = bench_module("fleet_floor")
fleet_shapes = bench_module("fleet_shapes")
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


@pytest.mark.parametrize("shape", fleet_shapes.MATRIX)
def test_in_every_shape_the_floor_is_a_lower_bound_and_cache_aware_beats_round_robin(shape: str) -> None:
    """The floor replays each run's own requests with every conversation pinned to one replica
    (issue 36): no gateway's policy recomputes less than it, and cache-aware recomputes less than round
    robin. No policy's p90 time to first token beats the bound on it, the floor's own pinning
    replayed live (`pinned`) included. Small: 2 replicas, 60 simulated seconds."""
    settings = fleet.settings_for(shape, 2, duration=60.0, warmup=10.0 if shape != "together" else 0.0)
    results = {policy: fleet.run_cell((settings, policy)) for policy in (*fleet.POLICIES, fleet.PINNED)}
    for policy, result in results.items():
        assert result["requests"] > 0, policy
        assert result["floor_per_request"] > 0, policy
        if policy != fleet.PINNED:  # its pins were chosen for cache-aware's run, another pinning than the floor's
            assert result["recomputed_per_request"] >= result["floor_per_request"], policy
        assert 0 < result["ttft_p90_bound"] <= result["ttft_p90"], policy
    assert results["cache_aware"]["recomputed_per_request"] < results["round_robin"]["recomputed_per_request"]


def test_the_floor_pins_each_conversation_and_balances_them_by_size() -> None:
    """Two conversations on two replicas, each sent twice: pinned apart, each computes its
    prompt once; its second turn finds the first turn and its reply cached."""
    one, two = list(range(100, 110)), list(range(200, 204))
    requests = [
        fleet_floor.Sent("a", one, 0.0, 6, 6 * 64, True, 1.0, 8),
        fleet_floor.Sent("b", two, 0.5, 2, 2 * 64, True, 1.5, 3),
        fleet_floor.Sent("a", one, 2.0, 10, 10 * 64, True, 3.0, 10),
        fleet_floor.Sent("b", two, 2.5, 4, 4 * 64, False, 3.5, 4),  # not measured: not counted
    ]
    assert fleet_floor.pins(requests, 2) == {"a": 0, "b": 1}
    assert fleet_floor.floor(requests, 2, 1_000, 64) == (6 + 2 + 2) * 64
    assert fleet_floor.floor(requests, 1, 1_000, 64) == (6 + 2 + 2) * 64  # one replica: no prefixes shared here
    assert fleet_floor.floor(requests, 2, 4, 64) == (6 + 2 + 10) * 64  # 4 blocks cached: a's second turn finds none


@pytest.mark.parametrize(("shape", "alone"), [("skewed", True), ("gateways", False)])
def test_a_lone_gateway_finds_itself_alone_and_three_gateways_do_not(shape: str, alone: bool) -> None:
    """Homes are kept only by a gateway alone: behind three, kept homes drift apart between
    them (docs/routing.md). Each tells from the turn it first sees each conversation at."""
    settings = fleet.settings_for(shape, 2, duration=30.0, warmup=5.0)
    simulated = fleet.Fleet(settings, "cache_aware")
    assert simulated.run()["requests"] > 0
    assert [gateway.homes.alone for gateway in simulated.gateways] == [alone] * settings.gateways


def test_the_real_replay_shape_warms_every_cache_and_its_floor_too() -> None:
    """The `replicas` shape is bench/replicas.py's replay (each replica holds the shared system
    prompt before it): the floor starts from the same warm caches, so it stays a lower bound."""
    settings = fleet.settings_for("replicas", 2, slots=2, prefill_rate=100.0, decode_rate=20.0)
    results = {policy: fleet.run_cell((settings, policy)) for policy in fleet.POLICIES}
    for policy, result in results.items():
        assert result["requests"] == 16, policy  # 4 conversations of 4 turns, all answered
        assert result["recomputed_per_request"] >= result["floor_per_request"] > 0, policy
    one = list(range(100, 104))
    requests = [fleet_floor.Sent("a", one, 0.0, 4, 4 * 64, True, 1.0, 4)]
    assert fleet_floor.floor(requests, 1, 1_000, 64, warm=(one[:2],)) == 2 * 64  # the warm blocks are not recomputed


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_lone_gateway_keeps_a_small_fleets_conversations_where_they_are(seed: int) -> None:
    """bench/replicas.py's replay, 4 conversations on 2 replicas: each stays on one replica, so
    cache-aware recomputes exactly the floor (seeds 2 and 3 put three on one replica, 1.4-1.5x,
    while the gateway took twenty first sights to find itself alone)."""
    settings = fleet.settings_for("replicas", 2, slots=2, prefill_rate=100.0, decode_rate=20.0, seed=seed)
    result = fleet.run_cell((settings, "cache_aware"))
    assert result["requests"] == 16
    assert result["recomputed_per_request"] == result["floor_per_request"]
