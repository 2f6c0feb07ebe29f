"""The benchmark's smoke mode, so bench/ never rots (no timing assertions)."""

import json
import subprocess
import sys

import pytest

from tests.support.bench import ROOT, bench_module


@pytest.mark.heavy
def test_bench_smoke_runs_every_path_without_a_failed_request():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--no-litellm", "--no-pin", "--wait-quiet", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "translating" in result.stdout and "passthrough" in result.stdout
    assert "relay-floor" in result.stdout  # the per-chunk CPU floor (bench/relay.py)
    assert "asgi-floor" in result.stdout  # the floor of uvicorn + aiohttp (bench/asgi_floor.py)
    # claude-code-router only when asked (--ccr): it installs into the cache and starts in seconds
    assert "claude-code-router not run" in result.stdout and "| ccr |" not in result.stdout
    # every reply through the passthrough path in Anthropic's format, as the load generator checks it
    assert "- passthrough: none (" in result.stdout


@pytest.mark.heavy
def test_bench_rounds_interleave_and_merge(tmp_path):
    """--rounds 2: each target's figures are its two rounds merged (the JSON keeps each round)."""
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--rounds", "2", "--no-litellm", "--no-pin", "--wait-quiet", "0",
         "--idle-streams", "0", "--targets", "direct-anthropic,passthrough", "--shapes", "tiny", "--modes", "json,paced100",
         "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "in each of 2 interleaved rounds" in result.stdout
    cells = json.loads(out.read_text())["cells"]
    assert {c["target"] for c in cells} == {"direct-anthropic", "passthrough"}
    for cell in cells:
        rounds = cell["by_round"]
        assert len(rounds) == 2
        assert cell["requests"] == sum(r["requests"] for r in rounds)
        assert cell["window_s"] == pytest.approx(sum(r["window_s"] for r in rounds), abs=0.002)
        if "server_cpu_s" in cell:
            assert cell["server_cpu_s"] == pytest.approx(sum(r["server_cpu_s"] for r in rounds), abs=0.002)


def test_bench_merge_pools_samples_and_sums_counts():
    run = bench_module("run")
    load = run.load

    a = load.Result(requests=3, errors=1, first_error="boom", window=2.0, latency=[0.001, 0.002, 0.003], ttft=[0.0005] * 3,
                    deltas=30, cpu=0.3, rss_before=10, rss_after=11, upstream_cpu=0.1, differences={load.ID: 3})  # fmt: skip
    b = load.Result(
        requests=1,
        window=2.5,
        latency=[0.010],
        ttft=[0.001],
        deltas=10,
        cpu=0.1,
        rss_before=12,
        rss_after=13,
        upstream_cpu=0.05,
        differences={load.ID: 1, load.REQUEST_ID: 1},
    )
    merged = run.merge([a, b])
    assert (merged.requests, merged.errors, merged.first_error, merged.deltas) == (4, 1, "boom", 40)
    assert (
        merged.window == pytest.approx(4.5)
        and merged.cpu == pytest.approx(0.4)
        and merged.upstream_cpu == pytest.approx(0.15)
    )
    assert merged.cpu_per_request_ms == pytest.approx(
        100.0
    )  # total CPU / total replies, not a mean of the rounds' figures
    assert merged.ms(50) == pytest.approx(2.0) and merged.ms(99) == pytest.approx(10.0)  # percentiles over all samples
    assert (merged.rss_before, merged.rss_after) == (10, 13)
    assert merged.differences == {load.ID: 4, load.REQUEST_ID: 1}  # replies differing from Anthropic's format, by kind
    assert a.latency == [0.001, 0.002, 0.003] and a.differences == {load.ID: 3}  # the rounds are left as they were
    assert (
        run.merge([load.Result(requests=1), load.Result(requests=1)]).cpu is None
    )  # no server to read (direct targets)
