"""What bench/fleet.py prints: a row per run, and each shape's targets (issue 36) over its seeds."""

from __future__ import annotations

from collections import defaultdict

HEAD = (f"{'shape':<8} {'replicas':>8} {'convs':>5} {'gw':>2} {'lm':>3} {'seed':>4} {'policy':<13} {'requests':>8} "
        f"{'recomputed':>10} {'per req':>7} {'floor':>6} {'x floor':>7} {'hit':>5} {'ttft p50':>8} {'ttft p90':>8} "
        f"{'req/s':>6} {'imbal':>5} {'moved':>5} {'µs/decision':>11}")  # fmt: skip


def row(r: dict) -> str:
    return (f"{r['shape']:<8} {r['replicas']:>8} {r['conversations']:>5} {r['gateways']:>2} {r['load_metrics']:>3g} "
            f"{r['seed']:>4} {r['policy']:<13} {r['requests']:>8} {r['recomputed_mtok']:>9.1f}M "
            f"{r['recomputed_per_request']:>7.0f} {r['floor_per_request']:>6.0f} {r['vs_floor']:>7.2f} {r['hit_rate']:>5.2f} "
            f"{r['ttft_p50']:>7.2f}s {r['ttft_p90']:>7.2f}s {r['throughput_rps']:>6.1f} {r['imbalance']:>5.2f} "
            f"{r['moved']:>5.2f} {r['decision_us']:>11.0f}")  # fmt: skip


def targets(results: list[dict]) -> list[str]:
    """Per shape and size, cache-aware's worst seed against each target: recomputed at most
    1.10x the floor (1.15x through several gateways), p90 time to first token at most half of
    round robin's in the same seed, the busiest replica at most 1.25x the mean; and the p90
    that no router could beat, over round robin's."""
    cells: dict[tuple, dict[tuple, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:  # round robin reads nothing: its run (load_metrics 0) is every cell's yardstick
        key = (r["shape"], r["replicas"], r["conversations"], r["gateways"])
        cells[key][(r["policy"], r["load_metrics"])][r["seed"]] = r
    lines = [f"{'shape':<8} {'replicas':>8} {'gw':>2} {'lm':>3} {'seeds':>5}  {'x floor (max)':<22} "
             f"{'p90 / rr (max)':<22} {'imbalance (max)':<22} {'any router: p90 / rr >=':<23}"]  # fmt: skip
    for (shape, replicas, _, gateways), policies in cells.items():
        theirs = policies.get(("round_robin", 0.0), {})
        for (policy, metrics), ours in policies.items():
            if policy == "cache_aware":
                lines.append(_cell(shape, replicas, gateways, metrics, ours, theirs))
    return lines


def _cell(shape: str, replicas: int, gateways: int, metrics: float, ours: dict, theirs: dict) -> str:
    limit = 1.15 if gateways > 1 else 1.10
    floor = max(r["vs_floor"] for r in ours.values())
    ratios = [r["ttft_p90"] / theirs[seed]["ttft_p90"] for seed, r in ours.items() if seed in theirs]
    bounds = [r["ttft_p90_bound"] / theirs[seed]["ttft_p90"] for seed, r in ours.items() if seed in theirs]
    imbalance = max(r["imbalance"] for r in ours.values())
    p90 = _verdict(max(ratios), 0.5) if ratios else "no round_robin run"
    return (f"{shape:<8} {replicas:>8} {gateways:>2} {metrics:>3g} {len(ours):>5}  {_verdict(floor, limit):<22} "
            f"{p90:<22} {_verdict(imbalance, 1.25):<22} {_bound(bounds)}")  # fmt: skip


def _bound(bounds: list[float]) -> str:
    """The p90 no router can beat (`fleet_floor.ttft_bound`) over round robin's: above 0.5 in
    a seed, the p90 target is out of reach there."""
    if not bounds:
        return ""
    return f"{max(bounds):.2f}" + (" (out of reach)" if max(bounds) > 0.5 else "")


def _verdict(value: float, limit: float) -> str:
    return f"{value:.2f} {'met' if value <= limit else 'NOT met'} (<= {limit:.2f})"
