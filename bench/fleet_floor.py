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
    pinned = pins(requests, replicas)
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
        cache = caches[pinned[request.conversation]]
        if kind == 0:
            cache.store(request.keys, request.done_keys)  # the reply's tokens were computed there
            continue
        cached = cache.lookup(request.keys, request.prompt_keys) * block_tokens
        cache.store(request.keys, request.prompt_keys)
        if request.measured:
            recomputed += request.prompt_tokens - min(cached, request.prompt_tokens)
    return recomputed


def pins(requests: list[Sent], replicas: int) -> dict[int, int]:
    """Each conversation's replica: where the active pinned conversations weigh least."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    size: dict[int, int] = {}
    for request in requests:
        first.setdefault(request.conversation, request.sent)
        last[request.conversation] = request.done if request.done is not None else float("inf")
        size[request.conversation] = max(size.get(request.conversation, 0), request.done_keys, request.prompt_keys)
    chosen: dict[int, int] = {}
    active: list[tuple[float, int]] = []  # (ends, conversation), soonest first
    weight = [0] * replicas
    for talk in sorted(first, key=first.__getitem__):
        while active and active[0][0] < first[talk]:
            _, ended = heapq.heappop(active)
            weight[chosen[ended]] -= size[ended]
        replica = weight.index(min(weight))
        chosen[talk] = replica
        weight[replica] += size[talk]
        heapq.heappush(active, (last[talk], talk))
    return chosen


@dataclass
class Turn:
    """One answered request, as the bound on its time to first token needs it."""

    conversation: str
    sent: float
    prompt_tokens: int
    output_tokens: int
    prefix: int  # its shared prefix (system prompt and tools): an id
    prefix_tokens: int
    measured: bool


def ttft_bound(turns: list[Turn], prefill_rate: float, overhead: float, warm: bool) -> list[float]:
    """A lower bound on each measured request's time to first token under any router: its
    own new tokens computed at once on an idle replica; a first turn's shared prefix too,
    unless (`warm`, or) another request computing it from the earliest moment one could
    finishes sooner. Nothing queues: a bound, not a prediction."""
    earliest: dict[int, float] = {}
    for turn in turns:
        earliest[turn.prefix] = min(earliest.get(turn.prefix, turn.sent), turn.sent)
    out, before = [], {}
    for turn in sorted(turns, key=lambda t: t.sent):
        previous = before.get(turn.conversation)
        before[turn.conversation] = turn
        if previous is not None:  # everything but the turn's new tokens may be cached
            new = turn.prompt_tokens - previous.prompt_tokens - previous.output_tokens
            bound = overhead + max(0, new) / prefill_rate
        else:
            own = turn.prompt_tokens - turn.prefix_tokens
            alone = overhead + (0 if warm else turn.prefix_tokens) / prefill_rate
            shared = earliest[turn.prefix] + overhead + turn.prefix_tokens / prefill_rate - turn.sent
            bound = min(alone, max(0.0, shared) + overhead) + own / prefill_rate
        if turn.measured:
            out.append(bound)
    return out
