"""Cache-aware routing against round robin on two real llama-server replicas: the servers' own
counters say cache-aware made them evaluate fewer prompt tokens for the same replay
(bench/replicas.py: fresh replicas and gateway per policy, the official SDK, streamed).

Prompts are kept in the servers' slots only (`--cache-ram 0`): that is the cache routing decides.
With llama-server's host-memory prompt cache on (its default), a conversation that moves is
restored from host memory, the two policies differ by a few dozen tokens out of a thousand, and
which comes out ahead varies from run to run (docs/performance.md, "Real replicas")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cache_aware_routing_evaluates_fewer_prompt_tokens_than_round_robin(tmp_path: Path) -> None:
    out = tmp_path / "replicas.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "replicas.py"), "--policies", "round_robin,cache_aware",
         "--conversations", "3", "--turns", "3", "--system-words", "120", "--server-args", "--cache-ram 0",
         "--json", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    by_policy = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    round_robin, cache_aware = by_policy["round_robin"], by_policy["cache_aware"]
    assert round_robin["requests"] == cache_aware["requests"] == 9
    assert 0 < cache_aware["evaluated"] < round_robin["evaluated"]
    assert cache_aware["cached"] > round_robin["cached"]
