"""Each conversation's home replica, agreed by gateway replicas that never talk.

A conversation's rendezvous order ranks the replicas by a hash of its identity and each
replica's URL: every gateway computes the same order. Its home is the first replica in
that order with room, room being `spread` x an even share of the active conversations
(or the even share alone, where `spread` adds less than one conversation to it).

A request may say where the conversation's turn before went (`previous`: its latest tool
call's id names the replica that made it, translate/tool_ids.py). That replica comes first,
whatever the home: it holds the conversation, whichever gateway sent it there.

Homes are kept, or assigned afresh. Kept (`kept`), a home moves where its conversation went
(a spill's prefix is there now: a home elsewhere would pull it back, to be computed again),
and stays while its replica holds less than a little more than the room (`KEEP_SLACK`: the
room shrinks and grows with the conversations active, and each home pushed out would be a
conversation computed again); only conversations seen in the last `IDLE_AFTER` seconds count
in the room (an idle one keeps its home, to which it comes back), so ended ones do not fill
replicas while the active ones crowd some. Homes are kept by a gateway that sees every turn
(`alone`: it sees each conversation first at its first turn; behind several gateways, most
first at a later turn), or whose requests mostly say where their turn before went: then
every gateway follows each conversation where it is. A gateway counts itself alone until
conversations first seen at a later turn say otherwise (about five do): learning it from
about twenty first sights instead, a small fleet's conversations were assigned afresh for
their whole lives, and one kept to the canonical order left its turn before's replica.

Otherwise, behind several gateways that cannot tell, kept homes would follow each gateway's
own history and drift apart; so homes are assigned afresh every `every` seconds from the
conversations seen in the last `max_age` seconds, taken in one canonical order (by identity):
two gateways that saw the same conversations agree on every home, whatever order they saw
them in; a conversation new since is placed alone. Each assignment may move homes (each
move recomputes a conversation): the price of agreeing. The room is looser there
(`shared_spread`): a tight room makes each conversation that one gateway has seen and
another not yet move more of the others' homes.

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
IDLE_AFTER = 30.0  # kept, a conversation not seen for this long holds no room (it keeps its home)
ALONE_BELOW = 0.25  # alone while fewer conversations than this are first seen at a later turn
KEEP_SLACK = 0.1  # kept, a home stays until its replica is home to (spread + this) x an even share
TOLD_ABOVE = 0.5  # homes are kept while more later turns than this say where their turn before went


class Homes:
    __slots__ = ("_clock", "_computed", "_counts", "_every", "_home", "_max", "_max_age", "_orders", "_pinned",
                 "_active", "_gaps", "_idle", "_seeds", "_seen", "_shared_spread", "_spread", "_told", "roots")  # fmt: skip

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
        self._idle: dict[bytes, int] = {}  # kept: the homes of conversations idle for IDLE_AFTER
        self._pinned: dict[bytes, int] = {}
        self._counts = [0] * len(roots)
        self._computed = -math.inf
        self._active = 0
        self._gaps = 0.0  # the share of conversations first seen at a later turn (an average): alone at first
        self._told = 0.0  # the share of later turns that said where their turn before went (an average)

    @property
    def alone(self) -> bool:
        """Whether this gateway seems the only one sending to these replicas."""
        return self._gaps < ALONE_BELOW

    @property
    def kept(self) -> bool:
        """Whether homes are kept and follow their conversations: this gateway sees every turn
        (`alone`), or most turns say where the turn before went, whichever gateway sent it."""
        return self._gaps < ALONE_BELOW or self._told > TOLD_ABOVE

    def order(self, identity: bytes, first_turn: bool | None = None, previous: str | None = None) -> list[str]:
        """The replicas for this conversation, its home first, then its rendezvous order.
        `first_turn`: whether this request is the conversation's first turn (None: unknown);
        `previous`: the replica its turn before went to, if the request says (one of `roots`)."""
        now = self._clock()
        self._seen.pop(identity, None)
        self._seen[identity] = now  # moved to the end: the most recently seen
        if first_turn is False:
            self._told += ((previous is not None) - self._told) * GAPS_WEIGHT
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
        if previous is not None:  # where it is: first whatever its home, which follows it where homes are kept
            self.went(identity, previous)
            return [previous, *(self.roots[i] for i in order if self.roots[i] != previous)]
        home = self._home[identity]
        return [self.roots[home], *(self.roots[i] for i in order if i != home)]

    def home_of(self, identity: bytes) -> str | None:
        """The conversation's home as last assigned, if it has one (for the simulated fleet's account)."""
        home = self._home.get(identity)
        return None if home is None else self.roots[home]

    def went(self, identity: bytes, root: str) -> None:
        """A turn of the conversation went to `root`. Where homes are kept, that is its home from
        now on: its prefix is there now, and a home elsewhere would pull it back to recompute it."""
        if self.kept:
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
        share = (self._spread if self.kept else self._shared_spread) * even
        return max(1, math.ceil(share if share - even >= 1 else even))

    def _place(self, identity: bytes, room: int) -> None:
        counts = self._counts
        order = self._orders[identity]
        home = next((i for i in order if counts[i] < room), order[0])
        self._home[identity] = home
        counts[home] += 1

    def _assign(self, now: float) -> None:
        """Every home, in canonical order; where homes are kept, each first kept where it is, if
        its replica is not far over the room."""
        self._computed = now
        oldest = now - self._max_age
        for identity in [i for i, seen in self._seen.items() if seen < oldest]:
            self._drop(identity)
        kept = self.kept
        before = {**self._idle, **self._home} if kept else {}
        self._idle = {}
        self._home = {}
        self._counts = counts = [0] * len(self.roots)
        for identity, home in self._pinned.items():
            self._home[identity] = home
            counts[home] += 1
        if kept:
            since = now - IDLE_AFTER
            active = sorted(i for i, seen in self._seen.items() if seen >= since)
            self._active = len(active)
            idle = self._seen.keys() - set(active)
            self._idle = {i: home for i, home in before.items() if i in idle and i not in self._pinned}
        else:
            active = sorted(self._seen)
            self._active = len(active)
        room = self._room()
        keep = max(room + 1, math.ceil((self._spread + KEEP_SLACK) * self._active / len(self.roots))) if kept else room
        moved = []
        for identity in active:
            if identity in self._pinned:
                continue
            was = before.get(identity)
            if was is not None and counts[was] < keep:  # kept: it stays while its replica is not far over
                self._home[identity] = was
                counts[was] += 1
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
