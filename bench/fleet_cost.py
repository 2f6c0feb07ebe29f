"""The CPU of one cache-aware decision (bench/fleet.py --decision-cost)."""

from __future__ import annotations

import time

from dragoman.core.config import CacheRouting
from dragoman.protocol import anthropic
from dragoman.upstream.placement import Placement, prompt_of


def decision_cost(replicas: int, repeat: int = 2000) -> dict[str, float]:
    """CPU µs of one routing decision for the benchmark's 80 KB claude-code request
    (bench/shapes.py): reading its prompt, choosing among `replicas` warm ones, noting it sent.
    A passed-through body's parts come from the `Envelope` the core reads for every such
    request, routed or not; that read is timed on its own (`envelope`)."""
    import shapes  # bench/shapes.py, beside this file

    anthropic_body = shapes.anthropic_body("claude-code", model="m", max_tokens=100, stream=True)
    parts = anthropic.ENVELOPE.decode(anthropic_body)
    bodies = {"translate": ("chat", shapes.openai_body("claude-code", model="m", max_tokens=100, stream=True)),
              "passthrough": (parts, anthropic_body)}  # fmt: skip
    roots = [f"http://10.0.0.{i + 1}:8000" for i in range(replicas)]
    out = {}
    for path, (kind, body) in bodies.items():
        placement = Placement(roots, "cache_aware", CacheRouting())
        for index, root in enumerate(roots):  # every replica holds the prompt: each match is a full search
            placement.sent(root, prompt_of(body, kind, None, placement.settings.block_bytes))  # type: ignore[arg-type]
            placement.report(root, 8 + index % 3, index % 2, 0.85 + index % 3 * 0.05, 1e9)  # and published its load
        started = time.process_time()
        for _ in range(repeat):
            prompt = prompt_of(body, kind, None, placement.settings.block_bytes)  # type: ignore[arg-type]
            root = placement.choose(roots, prompt).root
            placement.sent(root, prompt)
            placement.ended(root)
        out[path] = (time.process_time() - started) / repeat * 1e6
        out[path + "_bytes"] = len(body)
    started = time.process_time()
    for _ in range(repeat):
        anthropic.ENVELOPE.decode(anthropic_body)
    out["envelope"] = (time.process_time() - started) / repeat * 1e6
    return out
