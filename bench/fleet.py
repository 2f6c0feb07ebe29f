"""A simulated fleet: how each routing policy does with many replicas and conversations.

    python bench/fleet.py                       # the default matrix, about a minute
    python bench/fleet.py --replicas 32 --conversations 512 --gateways 1,3 --duration 300
    python bench/fleet.py --shape all --seeds 1-5 --load-metrics 1 --jobs 2   # every shape at 8 and 32 replicas, the targets
    python bench/fleet.py --decision-cost       # CPU of one decision for an 80 KB request

Time here is simulated, not measured: an event loop over a virtual clock, so 32 replicas and
512 conversations run on one core in seconds and every run is the same for a seed. The routing
is dragoman's own (`dragoman.upstream.placement`: the request body as the gateway would send it,
`prompt_of`, `Placement.choose`, `sent`, `ended`); everything else is a model:

- Conversations shaped like Claude Code's: a shared system prompt and tools (one main variant
  of 16k tokens, three sub-agent variants of 8k), a first user turn of its own, then turns that
  each add the assistant's reply and a tool result, with think time between them. A
  conversation ends after 6-20 turns and a new one takes its place (the concurrency is fixed).
  That is the `steady` shape; `--shape` picks others (bench/fleet_shapes.py: starting together,
  skewed lengths, Poisson churn, one long shared prefix, three gateways, and `replicas`:
  bench/replicas.py's replay, to set beside a real run).
- Replicas: a prefix cache of `--cache-tokens` in 64-token blocks, LRU, the reply's tokens
  cached with its prompt (as vLLM's prefix caching and llama-server's slots do); `--slots`
  requests run at once, more wait in a queue; prefill takes uncached tokens / `--prefill-rate`,
  one request at a time (what it finds cached is looked up when its prefill starts), and
  decoding output tokens / `--decode-rate`.
- Gateway replicas (`--gateways 3`): each request goes to one at random; each has its own
  prefix index and in-flight counts, and they share nothing. `--echo` (0.9): the share of
  later turns whose request says where the turn before went, as the tool ids of a reply do
  (translate/tool_ids.py, translated or passed through; a conversation that never called a
  tool says nothing: `--echo 0`). `--affinity`: the load balancer sends each session to one gateway.
- With `--load-metrics SECONDS`, each gateway reads every replica's own figures that often (as
  `dragoman.upstream.gauges` does from /metrics; each gateway at its own phase): requests
  running and waiting, and KV-cache usage, modelled as the running requests' tokens over
  `--cache-tokens`. `--load-metrics 0,1` compares without and with.
- `--outside N`: the first quarter of the replicas each also serve N requests at all times
  from clients that do not go through the gateways (8k-token prompts, none cached, 300 tokens
  out; a new one as each ends): load only the replicas' own figures show. Not measured.

Reported per cell, over the requests sent after `--warmup` seconds: prompt tokens recomputed
(evaluated, not served from cache), as a multiple of the floor (the same requests replayed
with each conversation pinned to one replica: bench/fleet_floor.py) and the cache hit rate, time to first token p50/p90,
throughput, and load imbalance (the busiest replica's time-averaged requests, running and
queued, over the mean). Beside the targets, the p90 time to first token no router could beat
(`fleet_floor.ttft_bound`) over round robin's. `--explain` says where each run's recomputation
comes from (bench/fleet_explain.py); `--policies pinned` runs the floor's own pinning live.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import count

import msgspec
import xxhash

import fleet_cost
import fleet_report
from dragoman.core.config import CacheRouting
from dragoman.upstream.placement import BYTES_PER_TOKEN, Placement, prompt_of
from fleet_explain import Explain
from fleet_floor import PrefixCache, Sent, Turn, floor, ttft_bound
from fleet_floor import pins as floor_pins
from fleet_shapes import BLOCK_TOKENS, MATRIX, SHAPES, Conversation, conversation, message, variants

POLICIES = ("round_robin", "least_loaded", "cache_aware")
PINNED = "pinned"  # not a gateway's: each conversation where the floor pinned it in cache-aware's run (`run_cell`)


@dataclass(frozen=True)
class Settings:
    replicas: int = 8
    conversations: int = 128
    gateways: int = 1
    duration: float = 200.0  # simulated seconds
    warmup: float = 40.0
    cache_tokens: int = 400_000
    slots: int = 16
    prefill_rate: float = 10_000.0  # tokens per second
    decode_rate: float = 50.0  # tokens per second per request
    seed: int = 1
    routing: dict[str, float] = field(default_factory=dict)  # cache_routing settings to override
    load_metrics: float = 0.0  # seconds between each gateway's reads of the replicas' own load; 0: none
    outside: int = 0  # requests kept in flight on each of the first quarter of the replicas by other clients
    shape: str = "steady"
    affinity: bool = False  # the load balancer sends each session to one gateway (hashing its id)
    echo: float = 0.9  # the share of later turns whose request says where the turn before went (its tool ids)
    explain: bool = False  # tell where the recomputation and the queues come from (bench/fleet_explain.py)


def settings_for(shape: str, replicas: int, **given: object) -> Settings:
    """A shape's settings at `replicas` (its conversations scaled from 8 replicas), with what
    was `given` (not None) instead."""
    it = SHAPES[shape]
    chosen = {"conversations": it.conversations * replicas // 8, "gateways": it.gateways, "duration": it.duration,
              "warmup": it.warmup, "cache_tokens": it.cache_tokens}  # fmt: skip
    chosen.update({key: value for key, value in given.items() if value is not None})
    return Settings(replicas=replicas, shape=shape, **chosen)  # type: ignore[arg-type]


@dataclass
class Request:
    conversation: Conversation | None  # None: another client's, not the gateways'
    sent: float
    prompt_tokens: int
    output_tokens: int
    gateway: int
    root: str = ""
    cached_tokens: int = 0
    first_token: float = 0.0
    record: Sent | None = None  # what the floor's replay needs of it
    tag: str = ""  # why it went where it did (--explain)


@dataclass
class Replica:
    root: str
    cache: PrefixCache
    running: int = 0
    active_tokens: int = 0  # the running requests' prompt and output tokens: their KV cache
    waiting: deque[Request] = field(default_factory=deque)
    prefilling: deque[Request] = field(default_factory=deque)
    prefill_busy: bool = False
    load_area: float = 0.0  # requests (running and waiting) integrated over time
    changed: float = 0.0

    def note_load(self, now: float, since: float) -> None:
        start = max(self.changed, since)
        if now > start:
            self.load_area += (self.running + len(self.waiting)) * (now - start)
        self.changed = now


class Fleet:
    def __init__(self, settings: Settings, policy: str, pins: dict[str, int] | None = None) -> None:
        self.s = settings
        self.policy = policy
        self.pins = pins or {}  # the `pinned` policy's: each session's replica
        self.rng = random.Random(settings.seed)
        roots = [f"http://10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(settings.replicas)]
        self.replicas = {root: Replica(root, PrefixCache(settings.cache_tokens // BLOCK_TOKENS)) for root in roots}
        self.roots = roots
        defaults = msgspec.structs.replace(CacheRouting(), **settings.routing)
        self.now = 0.0  # the simulated clock, which the gateways read too
        self.gateways = [
            Placement(roots, "cache_aware" if policy == "cache_aware" else "least_loaded", defaults, clock=self.clock)
            for _ in range(settings.gateways)
        ]
        self.turns = [0] * settings.gateways  # round robin's position, per gateway
        self.shape = SHAPES[settings.shape]
        self.variants = variants(random.Random(settings.seed + 1), self.shape)
        self.trace: list[Sent] = []  # every request sent, for the floor
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = count()
        self.done: list[Request] = []
        self.sessions = count()
        self.decision_seconds = 0.0
        self.decisions = 0
        self.last_done = 0.0  # when the last request ended
        self.moves = self.later_turns = 0  # turns sent to another replica than the turn before
        self.explain = Explain() if settings.explain else None
        self.echoes = random.Random(settings.seed + 2)  # apart: the workload stays the same

    def clock(self) -> float:
        return self.now

    def at(self, when: float, kind: str, what: object) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, what))

    def new_conversation(self) -> Conversation:
        return conversation(self.shape, self.variants, self.rng, f"session-{next(self.sessions)}")

    def run(self) -> dict[str, float]:
        s, shape = self.s, self.shape
        if shape.arrivals == "poisson":
            self._arrival(0.0, None)
        for _ in range(s.conversations):
            self.at(self.rng.uniform(0, 0.5 if shape.arrivals == "together" else 10), "send", self.new_conversation())
        for replica in self.replicas.values() if shape.warm else ():
            for variant in self.variants:
                replica.cache.store(variant.text.keys, len(variant.text.keys))
        for root in self.roots[: max(1, s.replicas // 4)] if s.outside else ():
            for _ in range(s.outside):
                self._outside(0.0, self.replicas[root])
        if self.explain is not None:
            self.at(0.0, "sample", None)
        if s.load_metrics and self.policy not in ("round_robin", PINNED):
            for gateway in range(s.gateways):
                self.at(self.rng.uniform(0, s.load_metrics), "scrape", gateway)
        while self.events:
            now, _, kind, what = heapq.heappop(self.events)
            if now > s.duration:
                break
            self.now = now
            getattr(self, "_" + kind)(now, what)
        for replica in self.replicas.values():
            replica.note_load(s.duration, s.warmup)
        return self.report()

    def _arrival(self, now: float, _: object) -> None:
        """Poisson arrivals: a conversation starts now, the next after an exponential gap."""
        if now:
            self._send(now, self.new_conversation())
        self.at(now + self.rng.expovariate(self.shape.rate * self.s.replicas / 8), "arrival", None)

    def _send(self, now: float, conversation: Conversation) -> None:
        gateway = self.rng.randrange(self.s.gateways)
        if self.s.affinity:
            gateway = xxhash.xxh3_64_intdigest(conversation.session.encode()) % self.s.gateways
        body = conversation.body()
        keys = conversation.text.keys
        tokens = len(conversation.text.data) // BYTES_PER_TOKEN
        request = Request(conversation, now, tokens, self.rng.randint(*self.shape.output), gateway)
        request.record = Sent(conversation.session, keys, now, len(keys), tokens, False)
        self.trace.append(request.record)
        if self.policy == "round_robin":
            request.root = self.roots[self.turns[gateway] % len(self.roots)]
            self.turns[gateway] += 1
        elif self.policy == PINNED:  # a session the floor never saw (the runs differ): in turn, then kept
            pin = self.pins.setdefault(conversation.session, len(self.pins) % len(self.roots))
            request.root = self.roots[pin]
        else:
            placement = self.gateways[gateway]
            started = time.process_time()
            told = conversation.replica and self.echoes.random() < self.s.echo  # as its tool ids would say
            prompt = prompt_of(body, "chat", conversation.session, placement.settings.block_bytes,
                               conversation.replica if told else None)  # fmt: skip
            request.root = placement.choose(self.roots, prompt).root
            placement.sent(request.root, prompt)
            self.decision_seconds += time.process_time() - started
            self.decisions += 1
        if self.explain is not None:
            home = self._home(gateway, conversation.session)
            request.tag = self.explain.tag(conversation.session, conversation.replica, request.root, gateway, home)
        if now >= self.s.warmup and conversation.replica:
            self.moves += conversation.replica != request.root
            self.later_turns += 1
        conversation.replica = request.root
        self._arrive(now, self.replicas[request.root], request)

    def _outside(self, now: float, replica: Replica) -> None:
        self._arrive(now, replica, Request(None, now, 8000, 300, -1, replica.root))

    def _arrive(self, now: float, replica: Replica, request: Request) -> None:
        replica.note_load(now, self.s.warmup)
        if replica.running < self.s.slots:
            self._start(now, replica, request)
        else:
            replica.waiting.append(request)

    def _scrape(self, now: float, gateway: object) -> None:
        """A gateway reads every replica's own figures (as from /metrics) and believes them for 3 reads."""
        assert isinstance(gateway, int)
        placement, capacity = self.gateways[gateway], self.s.cache_tokens
        for root, replica in self.replicas.items():
            kv = min(1.0, replica.active_tokens / capacity)
            placement.report(root, replica.running, len(replica.waiting), kv, 3 * self.s.load_metrics)
        self.at(now + self.s.load_metrics, "scrape", gateway)

    def _start(self, now: float, replica: Replica, request: Request) -> None:
        replica.running += 1
        replica.active_tokens += request.prompt_tokens + request.output_tokens
        replica.prefilling.append(request)
        if not replica.prefill_busy:
            self._next_prefill(now, replica)

    def _next_prefill(self, now: float, replica: Replica) -> None:
        if not replica.prefilling:
            replica.prefill_busy = False
            return
        replica.prefill_busy = True
        request, record = replica.prefilling[0], replica.prefilling[0].record
        if record is not None:  # what it finds cached when its prefill starts
            request.cached_tokens = replica.cache.lookup(record.keys, record.prompt_keys) * BLOCK_TOKENS
        uncached = request.prompt_tokens - min(request.cached_tokens, request.prompt_tokens)
        if self.explain is not None and request.conversation is not None:
            self.explain.count(request.tag, request.conversation.session, request.prompt_tokens,
                               request.cached_tokens, request.sent >= self.s.warmup)  # fmt: skip
        self.at(now + 0.02 + uncached / self.s.prefill_rate, "prefilled", replica)

    def _prefilled(self, now: float, replica: Replica) -> None:
        request = replica.prefilling.popleft()
        request.first_token = now
        if request.record is not None:
            replica.cache.store(request.record.keys, request.record.prompt_keys)
        self.at(now + request.output_tokens / self.s.decode_rate, "decoded", request)
        self._next_prefill(now, replica)

    def _decoded(self, now: float, request: Request) -> None:
        replica, conversation, rng = self.replicas[request.root], request.conversation, self.rng
        self.last_done = now
        replica.note_load(now, self.s.warmup)
        replica.running -= 1
        replica.active_tokens -= request.prompt_tokens + request.output_tokens
        if conversation is None:
            self._next_waiting(now, replica)
            self._outside(now, replica)  # the other client sends its next
            return
        if self.policy not in ("round_robin", PINNED):
            self.gateways[request.gateway].ended(request.root)
        conversation.append(message("assistant", rng, request.output_tokens))
        if self.explain is not None:
            self.explain.answered(conversation.session, request.prompt_tokens + request.output_tokens)
        record = request.record
        assert record is not None
        record.done, record.done_keys, record.measured = now, len(record.keys), request.sent >= self.s.warmup
        replica.cache.store(record.keys, record.done_keys)  # the reply's tokens were computed there
        self.done.append(request)
        conversation.turns_left -= 1
        self._next_waiting(now, replica)
        if conversation.turns_left <= 0:
            if self.shape.arrivals != "spread":
                return  # it ended: none takes its place
            conversation = self.new_conversation()
        else:
            conversation.append(message("user", rng, rng.randint(*conversation.user)))
        self.at(now + rng.uniform(*self.shape.think), "send", conversation)

    def _home(self, gateway: int, session: str) -> str | None:
        if self.policy != "cache_aware":
            return None
        return self.gateways[gateway].homes.home_of(session.encode())

    def _sample(self, now: float, _: object) -> None:
        assert self.explain is not None
        if now >= self.s.warmup:
            self.explain.sample(self.replicas)
        self.at(now + 1.0, "sample", None)

    def _next_waiting(self, now: float, replica: Replica) -> None:
        if replica.waiting:
            self._start(now, replica, replica.waiting.popleft())

    def report(self) -> dict[str, float]:
        s = self.s
        measured = [r for r in self.done if r.sent >= s.warmup]
        prompt = sum(r.prompt_tokens for r in measured)
        cached = sum(min(r.cached_tokens, r.prompt_tokens) for r in measured)
        ttfts = sorted(r.first_token - r.sent for r in measured)
        loads = [replica.load_area for replica in self.replicas.values()]
        window = min(s.duration, self.last_done) - s.warmup  # not to the last read of the replicas' load
        warm = tuple(v.text.keys for v in self.variants) if self.shape.warm else ()
        floored = floor(self.trace, s.replicas, s.cache_tokens // BLOCK_TOKENS, BLOCK_TOKENS, warm)
        bound = sorted(ttft_bound(self._turns(), s.prefill_rate, 0.02, self.shape.warm))
        explained = {}
        if self.explain is not None:
            areas = {root: replica.load_area for root, replica in self.replicas.items()}
            explained = {"explain": self.explain.lines(floored, prompt - cached, areas)}
        return {
            **explained,
            "requests": len(measured),
            "recomputed_mtok": (prompt - cached) / 1e6,
            "recomputed_per_request": (prompt - cached) / len(measured) if measured else 0.0,
            "floor_per_request": floored / len(measured) if measured else 0.0,
            "vs_floor": (prompt - cached) / floored if floored else 0.0,
            "hit_rate": cached / prompt if prompt else 0.0,
            "ttft_p50": _quantile(ttfts, 0.5),
            "ttft_p90": _quantile(ttfts, 0.9),
            "ttft_p90_bound": _quantile(bound, 0.9),
            "throughput_rps": len(measured) / window,
            "moved": self.moves / self.later_turns if self.later_turns else 0.0,
            "imbalance": max(loads) / (sum(loads) / len(loads)) if sum(loads) else 0.0,
            "decision_us": self.decision_seconds / self.decisions * 1e6 if self.decisions else 0.0,
        }

    def _turns(self) -> list[Turn]:
        """The answered requests, as `ttft_bound` needs them."""
        prefixes = {id(v): len(v.text.data) // BYTES_PER_TOKEN for v in self.variants}
        return [Turn(r.conversation.session, r.sent, r.prompt_tokens, r.output_tokens, id(r.conversation.variant),
                     prefixes[id(r.conversation.variant)], r.sent >= self.s.warmup)
                for r in self.done if r.conversation is not None]  # fmt: skip


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


DEFAULT_CELLS = [(8, 128, 1), (8, 128, 3), (8, 64, 1), (32, 512, 1)]  # the steady shape's, without --replicas


def run_cell(job: tuple[Settings, str]) -> dict:
    settings, policy = job
    pins = None
    if policy == PINNED:  # the floor's own pins, from a cache-aware run of the same cell, replayed live
        ran = Fleet(settings, "cache_aware")
        ran.run()
        pins = {str(talk): replica for talk, replica in floor_pins(ran.trace, settings.replicas).items()}
    result = Fleet(settings, policy, pins).run()
    return {"shape": settings.shape, "replicas": settings.replicas, "conversations": settings.conversations,
            "gateways": settings.gateways, "load_metrics": settings.load_metrics, "seed": settings.seed,
            "policy": policy, **result}  # fmt: skip


def _ints(text: str) -> list[int]:
    """`1,3` or `1-5`."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape", default="steady", help=f"comma-separated, of {', '.join(SHAPES)}; all: {', '.join(MATRIX)}"
    )
    parser.add_argument("--replicas", help="comma-separated replica counts (default: the steady matrix, else 8,32)")
    parser.add_argument("--conversations", help="comma-separated numbers of concurrent conversations")
    parser.add_argument("--gateways", help="comma-separated numbers of gateway replicas (default: the shape's)")
    parser.add_argument("--policies", help="default: all three with the steady shape, else round_robin,cache_aware; "
                        f"{PINNED}: the floor's pinning replayed live, for its time to first token")  # fmt: skip
    parser.add_argument("--duration", type=float, help="simulated seconds per cell (default: the shape's)")
    parser.add_argument("--warmup", type=float)
    parser.add_argument("--cache-tokens", type=int)
    parser.add_argument("--slots", type=int, default=Settings.slots)
    parser.add_argument("--prefill-rate", type=float, default=Settings.prefill_rate)
    parser.add_argument("--decode-rate", type=float, default=Settings.decode_rate)
    parser.add_argument("--seed", type=int, default=Settings.seed)
    parser.add_argument("--seeds", help="several seeds: 1-5 or 1,3")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once, in processes")
    parser.add_argument("--outside", type=int, default=0, metavar="N",
                        help="requests other clients keep in flight on each of the first quarter of the replicas")  # fmt: skip
    parser.add_argument("--load-metrics", default="0", metavar="SECONDS",
                        help="comma-separated intervals at which gateways read the replicas' own load; 0: never")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a cache_routing setting for this run (repeatable), e.g. --set load_tokens=256")  # fmt: skip
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--affinity", action="store_true", help="the load balancer sends each session to one gateway")
    parser.add_argument("--echo", type=float, default=Settings.echo,
                        help="the share of later turns whose request says where the turn before went")  # fmt: skip
    parser.add_argument("--explain", action="store_true", help="where each run's recomputation and queues come from")
    parser.add_argument("--decision-cost", action="store_true", help="only the CPU of one decision (8 and 32 replicas)")
    return parser


def _jobs(args: argparse.Namespace) -> list[tuple[Settings, str]]:
    routing = {key: type(getattr(CacheRouting(), key))(value) for key, value in (s.split("=", 1) for s in args.set)}
    jobs = []
    intervals = [float(m) for m in args.load_metrics.split(",")]
    for shape in MATRIX if args.shape == "all" else args.shape.split(","):
        if shape == "steady" and not (args.replicas or args.conversations):
            cells = [(r, c, g) for r, c, g in DEFAULT_CELLS if not args.gateways or str(g) in args.gateways.split(",")]
        else:
            cells = [(int(r), c and int(c), g and int(g)) for r in (args.replicas or "8,32").split(",")
                     for c in (args.conversations or "").split(",") for g in (args.gateways or "").split(",")]  # fmt: skip
        default = ",".join(POLICIES) if shape == "steady" else "round_robin,cache_aware"
        for (replicas, conversations, gateways), seed, metrics, policy in itertools.product(
            cells,
            _ints(args.seeds or str(args.seed)),
            intervals,
            (args.policies or default).split(","),
        ):
            if policy == "round_robin":  # it reads nothing: one run per cell, every interval's yardstick
                if metrics != intervals[0]:
                    continue
                metrics = 0.0
            settings = settings_for(shape, replicas, conversations=conversations or None, gateways=gateways or None,
                                    duration=args.duration, warmup=args.warmup, cache_tokens=args.cache_tokens,
                                    slots=args.slots, prefill_rate=args.prefill_rate, decode_rate=args.decode_rate,
                                    seed=seed, routing=routing, load_metrics=metrics, outside=args.outside,
                                    affinity=args.affinity, echo=args.echo, explain=args.explain)  # fmt: skip
            jobs.append((settings, policy))
    return jobs


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.decision_cost:
        for replicas in (8, 32):
            cost = fleet_cost.decision_cost(replicas)
            print(f"{replicas} replicas: {cost['translate']:.0f} µs translated ({cost['translate_bytes']:.0f} B body), "
                  f"{cost['passthrough']:.0f} µs passed through ({cost['passthrough_bytes']:.0f} B; the core's "
                  f"Envelope read of it, which every passed-through request pays: {cost['envelope']:.0f} µs)")  # fmt: skip
        return 0
    print(fleet_report.HEAD, flush=True)
    results = []
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        for result in pool.map(run_cell, _jobs(args)) if pool else map(run_cell, _jobs(args)):
            results.append(result)
            print(fleet_report.row(result), flush=True)
            print("\n".join(result.get("explain", [])), end="\n" if "explain" in result else "", flush=True)
    print("\n".join(["", "Targets, cache-aware's worst seed:", *fleet_report.targets(results)]))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"cells": results}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
