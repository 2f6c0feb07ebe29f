"""Each conversation's home replica, agreed by gateway replicas that never talk.

A conversation's rendezvous order ranks the replicas by a hash of its identity and each
replica's URL: every gateway computes the same order. Its home is the first replica in
that order with room, room being `spread` x an even share of the active conversations
(or the even share alone, where `spread` adds less than one conversation to it).
The homes are assigned afresh every `every` seconds, conversations taken in one canonical
order (by identity), so two gateways that saw the same active conversations assign the
same homes, whatever order they saw them in; a conversation new since then is placed
alone. Conversations not seen for `max_age` seconds are dropped.

Assigned afresh, a home moves whenever the set of conversations or the room changes, and
each move recomputes the conversation. That is the price of agreeing with other gateways;
a gateway that is alone need not pay it. It moves a home where the conversation went (a
spill's prefix is there now: a home elsewhere would pull it back, to be computed again), keeps
it while its replica holds less than a little more than the room (`KEEP_SLACK`: the room
shrinks and grows with the conversations active, and each home it pushed out would be a
conversation computed again), and counts in the room only the conversations seen in the last
`IDLE_AFTER` seconds (an idle one keeps its home, to which it comes back), so that ended
conversations do not fill replicas while the active ones crowd some of them.
It knows it is alone from the conversations themselves: behind one gateway, it sees each
conversation first at its first turn; behind several, most first at a later turn, whose
earlier turns another gateway sent (`alone`, an average over the conversations first seen).
Behind several, the room is looser (`shared_spread`): a tight room makes each conversation
that one gateway has seen and another not yet move more of the others' homes.

A conversation whose home was out (failed, passed over) when it came is pinned to the
replica it went to instead, and pins are placed first: a replica that comes back takes new
conversations as they come, rather than all of its old ones at once, each recomputed.

Bounded: at most `max_conversations` are remembered (the longest unseen dropped first),
about 300 bytes each with eight replicas (6 MB at most).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import xxhash

_hash = xxhash.xxh3_64_intdigest
GAPS_WEIGHT = 1 / 16  # each conversation first seen moves the average this much
IDLE_AFTER = 30.0  # alone, a conversation not seen for this long holds no room (it keeps its home)
ALONE_BELOW = 0.25  # alone while fewer conversations than this are first seen at a later turn
KEEP_SLACK = 0.1  # alone, a home is kept until its replica is home to (spread + this) x an even share


class Homes:
    __slots__ = ("_clock", "_computed", "_counts", "_every", "_home", "_max", "_max_age", "_orders", "_pinned",
                 "_active", "_gaps", "_idle", "_seeds", "_seen", "_shared_spread", "_spread", "roots")  # fmt: skip

    def __init__(
        self,
        roots: list[str],
        *,
        spread: float,
        max_age: float,
        clock: Callable[[], float],
        every: float = 1.0,
        max_conversations: int = 20_000,
        shared_spread: float | None = None,
    ) -> None:
        self.roots = roots
        self._seeds = [_hash(root.encode()) for root in roots]
        self._spread = spread
        self._shared_spread = spread if shared_spread is None else shared_spread
        self._max_age = max_age
        self._clock = clock
        self._every = every
        self._max = max_conversations
        self._seen: dict[bytes, float] = {}  # identity -> last seen (insertion order: oldest first)
        self._orders: dict[bytes, list[int]] = {}  # identity -> replica indexes, rendezvous order
        self._home: dict[bytes, int] = {}
        self._idle: dict[bytes, int] = {}  # alone: the homes of conversations idle for IDLE_AFTER
        self._pinned: dict[bytes, int] = {}
        self._counts = [0] * len(roots)
        self._computed = -math.inf
        self._active = 0
        self._gaps = 1.0  # the share of conversations first seen at a later turn (an average)

    @property
    def alone(self) -> bool:
        """Whether this gateway seems the only one sending to these replicas."""
        return self._gaps < ALONE_BELOW

    def order(self, identity: bytes, first_turn: bool | None = None) -> list[str]:
        """The replicas for this conversation, its home first, then its rendezvous order.
        `first_turn`: whether this request is the conversation's first turn (None: unknown)."""
        now = self._clock()
        self._seen.pop(identity, None)
        self._seen[identity] = now  # moved to the end: the most recently seen
        order = self._orders.get(identity)
        if order is None:
            if first_turn is not None:
                self._gaps += ((not first_turn) - self._gaps) * GAPS_WEIGHT
            order = self._orders[identity] = self._rank(identity)
            self._active += 1
            if len(self._seen) > self._max:
                self._drop(next(iter(self._seen)))
        if now - self._computed >= self._every:
            self._assign(now)
        elif identity in self._idle:  # back from idle: to its home (the next assignment weighs its room)
            self._home[identity] = home = self._idle.pop(identity)
            self._counts[home] += 1
        elif identity not in self._home:
            self._place(identity, self._room())
        home = self._home[identity]
        return [self.roots[home], *(self.roots[i] for i in order if i != home)]

    def home_of(self, identity: bytes) -> str | None:
        """The conversation's home as last assigned, if it has one (for the simulated fleet's account)."""
        home = self._home.get(identity)
        return None if home is None else self.roots[home]

    def went(self, identity: bytes, root: str) -> None:
        """A turn of the conversation went to `root`. Alone, that is its home from now on: its
        prefix is there now, and a home elsewhere would pull it back to recompute it."""
        if self.alone:
            home, index = self._home.get(identity), self.roots.index(root)
            if home is not None and home != index:
                self._counts[home] -= 1
                self._home[identity] = index
                self._counts[index] += 1

    def pin(self, identity: bytes, root: str) -> None:
        """The conversation lives on `root` from now on (its home was out)."""
        home, index = self._home.get(identity), self.roots.index(root)
        if home is not None:
            self._counts[home] -= 1
        self._pinned[identity] = self._home[identity] = index
        self._counts[index] += 1

    def _rank(self, identity: bytes) -> list[int]:
        weights = [_hash(identity, seed) for seed in self._seeds]
        return sorted(range(len(self.roots)), key=weights.__getitem__, reverse=True)

    def _room(self) -> int:
        """`spread` x an even share, rounded up, where that leaves room for at least one more
        conversation than the even share; else the even share, rounded up. With few
        conversations the rounding, not `spread`, would decide: 3 of 4 on one replica of two,
        whose cache, sized for two, would drop one of them at every turn."""
        even = self._active / len(self.roots)
        share = (self._spread if self.alone else self._shared_spread) * even
        return max(1, math.ceil(share if share - even >= 1 else even))

    def _place(self, identity: bytes, room: int) -> None:
        counts = self._counts
        order = self._orders[identity]
        home = next((i for i in order if counts[i] < room), order[0])
        self._home[identity] = home
        counts[home] += 1

    def _assign(self, now: float) -> None:
        """Every home, in canonical order; alone, each first kept where it is, if it has room."""
        self._computed = now
        oldest = now - self._max_age
        for identity in [i for i, seen in self._seen.items() if seen < oldest]:
            self._drop(identity)
        alone = self.alone
        before = {**self._idle, **self._home} if alone else {}
        self._idle = {}
        self._home = {}
        self._counts = counts = [0] * len(self.roots)
        for identity, home in self._pinned.items():
            self._home[identity] = home
            counts[home] += 1
        if alone:
            since = now - IDLE_AFTER
            active = sorted(i for i, seen in self._seen.items() if seen >= since)
            self._active = len(active)
            idle = self._seen.keys() - set(active)
            self._idle = {i: home for i, home in before.items() if i in idle and i not in self._pinned}
        else:
            active = sorted(self._seen)
            self._active = len(active)
        room = self._room()
        keep = max(room + 1, math.ceil((self._spread + KEEP_SLACK) * self._active / len(self.roots))) if alone else room
        moved = []
        for identity in active:
            if identity in self._pinned:
                continue
            kept = before.get(identity)
            if kept is not None and counts[kept] < keep:  # sticky: it stays while its replica is not far over
                self._home[identity] = kept
                counts[kept] += 1
            else:
                moved.append(identity)
        for identity in moved:
            self._place(identity, room)

    def _drop(self, identity: bytes) -> None:
        del self._seen[identity]
        del self._orders[identity]
        self._pinned.pop(identity, None)
        self._idle.pop(identity, None)
        home = self._home.pop(identity, None)
        if home is not None:
            self._counts[home] -= 1
