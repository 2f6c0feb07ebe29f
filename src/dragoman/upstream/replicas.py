"""Which instance (replica) of an upstream a request goes to, and which are passed over.

Requests rotate over the instances (round robin). An instance that failed is passed
over for a while, by how it failed (`CoolDowns`, the gateway's); one that answered `retry-after` for
that long, at most `retry_after_cap`. When every instance is passed over, one is
asked anyway: cool-downs alone never refuse traffic.

An instance that was silent (no connection within `connect_timeout`, or no first byte
within `first_byte_timeout`, a stream's head alone not counting: it accepts connections,
or drops them, and never answers)
costs a whole timeout to find out about again. So once its cool-down is over it gets one
request at a time, a trial, until it answers: otherwise every request sent to it while
the first waits out its timeout would wait too. A trial that answers puts the instance
back in the rotation; one that is silent again starts another cool-down.

Among the instances that are free, the upstream's `routing` policy chooses
(`dragoman.upstream.placement`): round robin here, least loaded or cache aware there.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dragoman.upstream.placement import Decision, Placement, Prompt

log = logging.getLogger("dragoman.upstream")


@dataclass(frozen=True, slots=True)
class CoolDowns:
    """Seconds an instance is passed over, by what it did."""

    # Refused or reset a connection, failed TLS, closed before answering: finding out
    # again costs nothing, so it is asked again soon.
    unreachable: float = 5.0
    # No connection or no first byte in time: finding out again costs a timeout, so it is
    # passed over longer, and then given one request at a time until it answers.
    silent: float = 30.0
    # Its own `retry-after` is honoured for that instance, up to this long.
    retry_after_cap: float = 60.0


class Replicas:
    """The instances of upstream `name` (`roots`) and when each may be asked again.

    `trial_for` bounds a trial (connect_timeout + first_byte_timeout): should its end
    never be reported, the instance is free again after that. `clock` is injectable
    for tests; `cool_downs` are the gateway's (`Gateway.timings.cool_downs`), else the defaults."""

    __slots__ = ("_clock", "_cool_downs", "_on_trial", "_silent", "_trial_for", "_turn", "_until", "name", "placement",
                 "roots")  # fmt: skip

    def __init__(
        self,
        name: str,
        roots: list[str],
        *,
        trial_for: float,
        cool_downs: CoolDowns | None = None,
        clock: Callable[[], float] = time.monotonic,
        placement: Placement | None = None,
    ) -> None:
        self.name = name
        self.roots = roots
        self.placement = placement  # None: round robin
        self._trial_for = trial_for
        self._cool_downs = cool_downs or CoolDowns()
        self._clock = clock
        self._turn = itertools.cycle(range(len(roots)))
        self._until: dict[str, float] = {}  # passed over until this time
        self._silent: set[str] = set()  # silent when last asked: one request at a time until it answers
        self._on_trial: set[str] = set()  # silent ones with their one request in flight

    def pick(self, avoid: str | None = None, *, trial: bool = True) -> str:
        """The next instance that is not passed over (nor `avoid`, the one a retry leaves);
        if there is none, the next of the others anyway. With `trial`, a silent instance
        picked is held for this request alone until `answered`, `failed` or `abandoned`."""
        return self.place(avoid, trial=trial).root

    def place(self, avoid: str | None = None, *, trial: bool = True, prompt: Prompt | None = None) -> Decision:
        """`pick`, with the reason: among the free instances the policy chooses (`prompt`
        is what cache-aware routing matches)."""
        placement = self.placement
        if placement is not None and prompt is None and placement.wants_prompt():
            placement = None  # cache aware with no prompt to match (a count, a probe): in turn
        if not self._until and avoid is None:  # none ever passed over (a silent one has a time here): the next in turn
            if placement is not None:
                return placement.choose(self.roots, prompt)
            return Decision(self.roots[next(self._turn)] if len(self.roots) > 1 else self.roots[0], "round_robin")
        now = self._clock()
        candidates = [root for root in self.roots if root != avoid and self._until.get(root, 0.0) <= now]
        if not candidates:  # every other instance is passed over: one is still asked
            candidates = [root for root in self.roots if root != avoid] or self.roots
        if placement is not None:
            decision = placement.choose(candidates, prompt, avoid)
        else:
            decision = Decision(self._next_of(candidates), "round_robin")
        root = decision.root
        if trial and root in self._silent:
            self._on_trial.add(root)
            self._until[root] = max(self._until.get(root, 0.0), now + self._trial_for)
        return decision

    def _next_of(self, candidates: list[str]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        for _ in range(len(self.roots)):
            candidate = self.roots[next(self._turn)]
            if candidate in candidates:
                return candidate
        return candidates[0]

    def order(self) -> list[str]:
        """Every instance, the next in the rotation first (for a request sent to each in
        turn: a model list). No trial is started: such an answer says nothing of requests."""
        first = self.pick(trial=False)
        return [first, *(root for root in self.roots if root != first)]

    def others_free(self, root: str) -> bool:
        """Whether an instance other than `root` is not passed over."""
        now = self._clock()
        return any(self._until.get(other, 0.0) <= now for other in self.roots if other != root)

    def passed_over(self, root: str) -> bool:
        """Whether `root` is resting after a failure now (what the console shows as unhealthy)."""
        return self._until.get(root, 0.0) > self._clock()

    def answered(self, root: str) -> None:
        """`root` answered a request (its response head came; for a stream, the first bytes of
        its body: `dragoman.upstream.opening`): a silent instance is back."""
        if root in self._silent:
            self._silent.discard(root)
            self._on_trial.discard(root)
            self._until.pop(root, None)
            log.info("upstream %s: instance %s answers again", self.name, root)

    def failed(self, root: str, *, silent: bool) -> None:
        """`root` failed a request before answering: passed over for its cool-down (a
        longer `retry-after` it sent stands; a trial's hold does not)."""
        if self.placement is not None:
            self.placement.forget(root)
        held = 0.0 if root in self._on_trial else self._until.get(root, 0.0)
        self._on_trial.discard(root)
        if silent:
            if root not in self._silent:  # once per silence, not at each trial
                log.warning("upstream %s: instance %s did not answer in time; passed over for %g s, then sent one request at a "
                            "time until it answers", self.name, root, self._cool_downs.silent)  # fmt: skip
            self._silent.add(root)
        else:
            self._silent.discard(root)  # it answers at once now (refusing): no trial needed
        cool_down = self._cool_downs.silent if silent else self._cool_downs.unreachable
        self._until[root] = max(held, self._clock() + cool_down)

    def abandoned(self, root: str) -> None:
        """A request to `root` ended before its answer for a reason of the gateway's (the
        client left): if it was a trial, the next request tries the instance instead."""
        if root in self._on_trial:
            self._on_trial.discard(root)
            self._until[root] = self._clock()

    def pass_over(self, root: str, seconds: float) -> bool:
        """Pass `root` over for the `retry-after` it sent (capped); whether another
        instance is free to take the request meanwhile."""
        self._until[root] = max(
            self._until.get(root, 0.0), self._clock() + min(seconds, self._cool_downs.retry_after_cap)
        )
        return self.others_free(root)
