"""The floor of the simulated fleet (bench/fleet.py): what a perfect router would recompute.

Every run's requests are replayed (the same prompts, in the same order at the same times,
through the same cache model) with each conversation pinned to one replica for its whole
life: when it starts, to the replica whose pinned, still-active conversations are the
smallest in all (their final sizes: the oracle knows the future), so the pinning is balanced
by size. A policy's recomputed prompt tokens are reported as a multiple of this floor.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass


class PrefixCache:
    """A replica's prefix cache: chained block keys, least recently used dropped first."""

    __slots__ = ("blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity

    def lookup(self, keys: list[int], count: int) -> int:
        """How many of the first `count` keys are held (the leading run), each touched."""
        blocks, matched = self.blocks, 0
        for key in keys[:count]:
            if key not in blocks:
                break
            blocks.move_to_end(key)
            matched += 1
        return matched

    def store(self, keys: list[int], count: int) -> None:
        blocks = self.blocks
        for key in keys[:count]:
            blocks[key] = None
            blocks.move_to_end(key)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)


@dataclass
class Sent:
    """One request as the replay needs it. `keys` is its conversation's key list, which only
    grows: the first `prompt_keys` were its prompt, the first `done_keys` its prompt and reply."""

    conversation: int
    keys: list[int]
    sent: float
    prompt_keys: int
    prompt_tokens: int
    measured: bool  # counted in the policy's figures (sent after the warm-up, answered)
    done: float | None = None
    done_keys: int = 0


def floor(
    requests: list[Sent], replicas: int, capacity: int, block_tokens: int, warm: tuple[list[int], ...] = ()
) -> int:
    """Prompt tokens the pinned replay recomputes over the measured requests (each cache
    holding the `warm` prefixes first, as the policy's did)."""
    pins = _pins(requests, replicas)
    caches = [PrefixCache(capacity) for _ in range(replicas)]
    for cache in caches:
        for keys in warm:
            cache.store(keys, len(keys))
    events: list[tuple[float, int, int, Sent]] = []  # (time, ends before sends, order, request)
    for order, request in enumerate(requests):
        events.append((request.sent, 1, order, request))
        if request.done is not None:
            events.append((request.done, 0, order, request))
    heapq.heapify(events)
    recomputed = 0
    while events:
        _, kind, _, request = heapq.heappop(events)
        cache = caches[pins[request.conversation]]
        if kind == 0:
            cache.store(request.keys, request.done_keys)  # the reply's tokens were computed there
            continue
        cached = cache.lookup(request.keys, request.prompt_keys) * block_tokens
        cache.store(request.keys, request.prompt_keys)
        if request.measured:
            recomputed += request.prompt_tokens - min(cached, request.prompt_tokens)
    return recomputed


def _pins(requests: list[Sent], replicas: int) -> dict[int, int]:
    """Each conversation's replica: where the active pinned conversations weigh least."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    size: dict[int, int] = {}
    for request in requests:
        first.setdefault(request.conversation, request.sent)
        last[request.conversation] = request.done if request.done is not None else float("inf")
        size[request.conversation] = max(size.get(request.conversation, 0), request.done_keys, request.prompt_keys)
    pins: dict[int, int] = {}
    active: list[tuple[float, int]] = []  # (ends, conversation), soonest first
    weight = [0] * replicas
    for talk in sorted(first, key=first.__getitem__):
        while active and active[0][0] < first[talk]:
            _, ended = heapq.heappop(active)
            weight[pins[ended]] -= size[ended]
        replica = weight.index(min(weight))
        pins[talk] = replica
        weight[replica] += size[talk]
        heapq.heappush(active, (last[talk], talk))
    return pins
