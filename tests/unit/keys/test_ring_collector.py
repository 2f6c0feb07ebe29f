"""The keys a keyring holds stay out of the garbage collector's sight: with 100,000 keys, every
collection would otherwise walk each one (docs/performance.md, the team cell)."""

from __future__ import annotations

import gc

from dragoman.core.limit_settings import LimitSet
from dragoman.keys.records import Budget, KeyRow
from dragoman.keys.ring import Keyring


def test_the_keys_held_are_not_tracked_by_the_collector() -> None:
    ring = Keyring(["sk-configured"])
    ring.apply([KeyRow(id="key_1", digest="d1", hint="h", name="alice", models=["claude-*"], budget=Budget(amount="100"),
                       limits=LimitSet(requests_per_minute=5), version=1)])  # fmt: skip
    assert len(ring.by_id) == 2
    assert not any(gc.is_tracked(grant) for grant in ring.by_id.values())
    assert ring.by_id["key_1"].allows("claude-3") and not ring.by_id["key_1"].allows("gpt-4")
