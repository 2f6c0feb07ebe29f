"""Why a simulated fleet's run recomputes what it does (bench/fleet.py --explain): each measured
request's recomputed prompt tokens put under the placement that caused them, and each replica's
queue over time.

- `first`: a conversation's first turn (its shared prefix, where the replica lacked it, and its
  own first user turn).
- `stay`: a later turn on the replica of the turn before; beyond the tokens new since that
  turn (`stay-evicted`), the replica's cache had dropped some of it.
- `moved-…`: a later turn sent elsewhere than the turn before, by why: `home-changed` (the
  deciding gateway's home for it moved, and it went there), `disagree` (it went to the deciding
  gateway's home, while the turn before went to another gateway's home for it), `spill` (not
  to the deciding gateway's home: the load bound or the cost).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class Explain:
    tokens: Counter[str] = field(default_factory=Counter)  # recomputed prompt tokens, by cause
    requests: Counter[str] = field(default_factory=Counter)
    new_tokens: dict[str, int] = field(default_factory=dict)  # by session: its last turn's prompt and reply
    homes: dict[str, tuple[int, str]] = field(default_factory=dict)  # by session: last turn's gateway, its home
    waiting: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # sampled queue lengths
    running: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def tag(self, session: str, previous: str, root: str, gateway: int, home: str | None) -> str:
        """The cause of a turn sent to `root` by `gateway` (its turn before went to `previous`;
        the gateway's home for it is `home`)."""
        before = self.homes.get(session)
        self.homes[session] = (gateway, home or "")
        if not previous:
            return "first"
        if root == previous:
            return "stay"
        if home != root:
            return "moved-spill"
        disagree = before is not None and before[0] != gateway and before[1] != home and before[1] == previous
        return "moved-disagree" if disagree else "moved-home-changed"

    def count(self, tag: str, session: str, prompt: int, cached: int, measured: bool) -> None:
        new = prompt - self.new_tokens.get(session, 0)
        if not measured:
            return
        recomputed = prompt - min(cached, prompt)
        self.requests[tag] += 1
        if tag == "stay":
            self.tokens["stay-new"] += min(recomputed, new)
            self.tokens["stay-evicted"] += max(0, recomputed - new)
        else:
            self.tokens[tag] += recomputed

    def answered(self, session: str, tokens: int) -> None:
        self.new_tokens[session] = tokens

    def sample(self, replicas: dict) -> None:
        for root, replica in replicas.items():
            self.waiting[root].append(len(replica.waiting))
            self.running[root].append(replica.running)

    def lines(self, floor: float, recomputed: float, loads: dict[str, float]) -> list[str]:
        excess = (recomputed - floor) / 1e6
        out = [f"  recomputed {recomputed / 1e6:.2f}M, the floor {floor / 1e6:.2f}M (excess {excess:.2f}M)"]
        for tag, tokens in sorted(self.tokens.items(), key=lambda kv: -kv[1]):
            base = tag.removesuffix("-new").removesuffix("-evicted")
            out.append(f"  {tag:<20} {tokens / 1e6:7.2f}M  ({self.requests[base]} requests)")
        mean = sum(loads.values()) / len(loads) if loads else 0.0
        for root, load in sorted(loads.items(), key=lambda kv: -kv[1])[:4]:
            waiting, running = self.waiting[root], self.running[root]
            out.append(f"  {root}: load {load / mean if mean else 0:.2f}x mean, waiting mean "
                       f"{sum(waiting) / max(1, len(waiting)):.1f} max {max(waiting, default=0)}, running mean "
                       f"{sum(running) / max(1, len(running)):.1f}")  # fmt: skip
        return out
