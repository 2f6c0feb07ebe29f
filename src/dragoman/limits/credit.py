"""Credit: requests a Redis store admits without a round trip, taken ahead in one.

Each round trip to Redis costs the gateway a wait on another process: at concurrency 1, a
sleep and a wake-up, most of the 60-90 µs of CPU that limits in Redis cost per request on a
2-core VM (docs/performance.md). So where every bucket a request takes from keeps more than
half of what it can give after taking (its level above `need - cost`, the lowest a take may
leave: 0 for a rate, the budget's edge for a key's money), `STEP` takes the cost of up to
`limits.redis_credit` more requests just like it, and this process admits those from its
credit for `CREDIT_TTL` seconds.

What a credit took, Redis took: no process admits more than a bucket holds, and a bucket
under half full gives none, so near the edge every request is decided in Redis as before.
A bucket taken from only when the request ends (input tokens, a budget) is checked against
its level when the credit was given, at most `CREDIT_TTL` before, and only while that level
was above half. A credit not used in time is given back. A pure module: no I/O.

A credit held by one process is refused to the others until it is used or given back, so one
holds at most `HOLD` of any bucket: a bucket under 64 requests gives none (every request
decided in Redis, exact), and a burst through several processes is refused early by at most
that share per process, for at most `CREDIT_TTL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dragoman.limits.store import Taken, Want

CREDIT_TTL = 1.0  # seconds a credit lasts
HALF = 0.5  # the share of what a bucket can give that it must keep for a credit (in STEP too)
HOLD = 1 / 64  # the share of what a bucket can give that one credit may hold, at most (in STEP)


def kept(want: Want) -> float:
    """The level a credit must leave `want`'s bucket above: HALF of what it can give over
    `need - cost`, the lowest level a take may leave (STEP computes the same in Lua)."""
    floor = want.need - want.cost
    return floor + (want.capacity - floor) * HALF


@dataclass(slots=True)
class Credit:
    """Requests with these wants still admitted here: `left` of them, each taking `cost`."""

    wants: tuple[Want, ...]
    left: int
    levels: list[float]  # each bucket's level, counting what the credit still holds
    until: float

    def use(self) -> Taken:
        """One request admitted from the credit: its levels as Redis would have reported them."""
        self.left -= 1
        for index, want in enumerate(self.wants):
            self.levels[index] -= want.cost
        return Taken(True, list(self.levels))

    def charged(self, want: Want, delta: float) -> bool:
        """A settlement of `delta` (< 0) to `want`'s bucket, made here; whether the credit still
        holds: a bucket taken from only at the end must stay above half full."""
        for index, mine in enumerate(self.wants):
            if mine.key == want.key:
                self.levels[index] += delta
                if not mine.cost and self.levels[index] < kept(mine):
                    return False
        return True

    def unused(self) -> list[tuple[Want, float]]:
        """What giving the rest back adds to each bucket."""
        return [(want, want.cost * self.left) for want in self.wants if want.cost and self.left]


def granted(wants: Sequence[Want], levels: list[float], extra: int, until: float) -> tuple[Taken, Credit | None]:
    """A take Redis admitted, having taken `extra` more of each cost: the request's own levels
    (what the bucket holds, the credit counted in), and the credit, if any."""
    if not extra:
        return Taken(True, levels), None
    held = [level + want.cost * extra for want, level in zip(wants, levels, strict=True)]
    return Taken(True, list(held)), Credit(tuple(wants), extra, held, until)
