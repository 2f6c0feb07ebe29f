"""The token-count cache holds counts, not conversations: its memory does not grow with
the size of what was counted (sixty 4 MiB requests once held 260 MiB for good)."""

from __future__ import annotations

import gc
import tracemalloc

from dragoman.backends.openai.counting import CountCache

MiB = 1024 * 1024


def test_counting_large_requests_leaves_the_cache_small() -> None:
    cache = CountCache()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(32):
            conversation = b"%d" % n + b"x" * MiB  # dropped after each round, as a request's bytes are
            cache.put(CountCache.key("model", conversation, b"null"), (n, "upstream"))
            del conversation
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 4 * MiB, f"the cache holds {held} bytes for 32 counts of 1 MiB"  # without digests: 32 MiB


def test_identical_requests_hit_and_others_miss() -> None:
    cache = CountCache()
    cache.put(CountCache.key("m", b"[1]", b"null"), (7, "upstream"))
    assert cache.get(CountCache.key("m", b"[1]", b"null")) == (7, "upstream")
    assert cache.get(CountCache.key("other", b"[1]", b"null")) is None  # another model
    assert cache.get(CountCache.key("m", b"[1]", b"[]")) is None  # other tools
    assert cache.get(CountCache.key("m", b"[1]n", b"ull")) is None  # the same bytes split elsewhere


def test_the_least_recently_used_count_goes_first() -> None:
    cache = CountCache(size=2)
    a, b, c = (CountCache.key("m", part) for part in (b"a", b"b", b"c"))
    cache.put(a, (1, "upstream"))
    cache.put(b, (2, "upstream"))
    assert cache.get(a) == (1, "upstream")
    cache.put(c, (3, "upstream"))
    assert cache.get(b) is None and cache.get(a) == (1, "upstream") and cache.get(c) == (3, "upstream")
