"""A simulated fleet: how each routing policy does with many replicas and conversations.

    python bench/fleet.py                       # the default matrix, about a minute
    python bench/fleet.py --replicas 32 --conversations 512 --gateways 1,3 --duration 300
    python bench/fleet.py --decision-cost       # CPU of one decision for an 80 KB request

Time here is simulated, not measured: an event loop over a virtual clock, so 32 replicas and
512 conversations run on one core in seconds and every run is the same for a seed. The routing
is dragoman's own (`dragoman.upstream.placement`: the request body as the gateway would send it,
`prompt_of`, `Placement.choose`, `sent`, `ended`); everything else is a model:

- Conversations shaped like Claude Code's: a shared system prompt and tools (one main variant
  of 16k tokens, three sub-agent variants of 8k), a first user turn of its own, then turns that
  each add the assistant's reply and a tool result, with think time between them. A
  conversation ends after 6-20 turns and a new one takes its place (the concurrency is fixed).
- Replicas: a prefix cache of `--cache-tokens` in 64-token blocks, LRU, the reply's tokens
  cached with its prompt (as vLLM's prefix caching and llama-server's slots do); `--slots`
  requests run at once, more wait in a queue; prefill takes uncached tokens / `--prefill-rate`,
  one request at a time, and decoding output tokens / `--decode-rate`.
- Gateway replicas (`--gateways 3`): each request goes to one at random; each has its own
  prefix index and in-flight counts, and they share nothing.
- With `--load-metrics SECONDS`, each gateway reads every replica's own figures that often (as
  `dragoman.upstream.gauges` does from /metrics; each gateway at its own phase): requests
  running and waiting, and KV-cache usage, modelled as the running requests' tokens over
  `--cache-tokens`. `--load-metrics 0,1` compares without and with.
- `--outside N`: the first quarter of the replicas each also serve N requests at all times
  from clients that do not go through the gateways (8k-token prompts, none cached, 300 tokens
  out; a new one as each ends): load only the replicas' own figures show. Not measured.

Reported per cell, over the requests sent after `--warmup` seconds: prompt tokens recomputed
(evaluated, not served from cache) and the cache hit rate, time to first token p50/p90,
throughput, and load imbalance (the busiest replica's time-averaged requests, running and
queued, over the mean).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import count

import msgspec

from dragoman.core.config import CacheRouting
from dragoman.protocol import anthropic
from dragoman.upstream.placement import BYTES_PER_TOKEN, Placement, prompt_of

POLICIES = ("round_robin", "least_loaded", "cache_aware")
BLOCK_TOKENS = 64  # the replicas' cache granularity (vLLM's default block is 16 tokens; coarser is faster here)
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN


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


class Text:
    """A prompt in prompt order and its cache blocks' chained keys, grown in place."""

    def __init__(self, data: bytes = b"", keys: tuple[int, ...] = ()) -> None:
        self.data = bytearray(data)
        self.keys = list(keys)

    def add(self, part: bytes) -> None:
        self.data += part
        for start in range(len(self.keys) * BLOCK_BYTES, len(self.data) - BLOCK_BYTES + 1, BLOCK_BYTES):
            self.keys.append(hash((self.keys[-1] if self.keys else 0, bytes(self.data[start : start + BLOCK_BYTES]))))

    def copy(self) -> Text:
        return Text(bytes(self.data), tuple(self.keys))


def _filler(rng: random.Random, tokens: int) -> str:
    return rng.randbytes(tokens * BYTES_PER_TOKEN // 2).hex()


@dataclass
class Variant:
    tools: bytes
    system: bytes  # the system message, as the first message of a chat body
    text: Text


def _variants(rng: random.Random) -> list[Variant]:
    out = []
    for tools_tokens in (14_000, 6_000, 6_000, 6_000):
        tools = json.dumps([{"type": "function", "function": {"name": "t", "description": _filler(rng, tools_tokens)}}])
        system = json.dumps({"role": "system", "content": _filler(rng, 2_000)})
        text = Text()
        text.add(tools.encode() + system.encode())
        out.append(Variant(tools.encode(), system.encode(), text))
    return out


@dataclass
class Conversation:
    variant: Variant
    session: str
    turns_left: int
    messages: list[bytes]
    text: Text
    replica: str = ""  # where its last turn went

    def body(self) -> bytes:
        messages = b",".join([self.variant.system, *self.messages])
        return b'{"model":"m","messages":[' + messages + b'],"tools":' + self.variant.tools + b"}"

    def append(self, message: bytes) -> None:
        self.messages.append(message)
        self.text.add(message)


def _message(role: str, rng: random.Random, tokens: int) -> bytes:
    return json.dumps({"role": role, "content": _filler(rng, tokens)}).encode()


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


@dataclass
class Replica:
    root: str
    capacity_blocks: int
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
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

    def lookup(self, keys: list[int]) -> int:
        cache, matched = self.cache, 0
        for key in keys:
            if key not in cache:
                break
            cache.move_to_end(key)
            matched += 1
        return matched

    def store(self, keys: list[int]) -> None:
        cache = self.cache
        for key in keys:
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > self.capacity_blocks:
            cache.popitem(last=False)


class Fleet:
    def __init__(self, settings: Settings, policy: str) -> None:
        self.s = settings
        self.policy = policy
        self.rng = random.Random(settings.seed)
        roots = [f"http://10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(settings.replicas)]
        self.replicas = {root: Replica(root, settings.cache_tokens // BLOCK_TOKENS) for root in roots}
        self.roots = roots
        defaults = msgspec.structs.replace(CacheRouting(), **settings.routing)
        self.now = 0.0  # the simulated clock, which the gateways read too
        self.gateways = [
            Placement(roots, "cache_aware" if policy == "cache_aware" else "least_loaded", defaults, clock=self.clock)
            for _ in range(settings.gateways)
        ]
        self.turns = [0] * settings.gateways  # round robin's position, per gateway
        self.variants = _variants(random.Random(settings.seed + 1))
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = count()
        self.done: list[Request] = []
        self.sessions = count()
        self.decision_seconds = 0.0
        self.decisions = 0
        self.moves = self.later_turns = 0  # turns sent to another replica than the turn before

    def clock(self) -> float:
        return self.now

    def at(self, when: float, kind: str, what: object) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, what))

    def new_conversation(self) -> Conversation:
        rng = self.rng
        variant = self.variants[0] if rng.random() < 0.75 else self.variants[rng.randrange(1, 4)]
        first = _message("user", rng, rng.randint(200, 800))
        conversation = Conversation(
            variant, f"session-{next(self.sessions)}", rng.randint(6, 20), [], variant.text.copy()
        )
        conversation.append(first)
        return conversation

    def run(self) -> dict[str, float]:
        s = self.s
        for _ in range(s.conversations):
            self.at(self.rng.uniform(0, 10), "send", self.new_conversation())
        for root in self.roots[: max(1, s.replicas // 4)] if s.outside else ():
            for _ in range(s.outside):
                self._outside(0.0, self.replicas[root])
        if s.load_metrics and self.policy != "round_robin":
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

    def _send(self, now: float, conversation: Conversation) -> None:
        gateway = self.rng.randrange(self.s.gateways)
        body = conversation.body()
        request = Request(conversation, now, len(conversation.text.data) // BYTES_PER_TOKEN,
                          self.rng.randint(100, 500), gateway)  # fmt: skip
        if self.policy == "round_robin":
            request.root = self.roots[self.turns[gateway] % len(self.roots)]
            self.turns[gateway] += 1
        else:
            placement = self.gateways[gateway]
            started = time.process_time()
            prompt = prompt_of(body, "chat", conversation.session, placement.settings.block_bytes)
            request.root = placement.choose(self.roots, prompt).root
            placement.sent(request.root, prompt)
            self.decision_seconds += time.process_time() - started
            self.decisions += 1
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
        if request.conversation is not None:
            request.cached_tokens = replica.lookup(request.conversation.text.keys) * BLOCK_TOKENS
        replica.prefilling.append(request)
        if not replica.prefill_busy:
            self._next_prefill(now, replica)

    def _next_prefill(self, now: float, replica: Replica) -> None:
        if not replica.prefilling:
            replica.prefill_busy = False
            return
        replica.prefill_busy = True
        request = replica.prefilling[0]
        uncached = request.prompt_tokens - request.cached_tokens
        self.at(now + 0.02 + uncached / self.s.prefill_rate, "prefilled", replica)

    def _prefilled(self, now: float, replica: Replica) -> None:
        request = replica.prefilling.popleft()
        request.first_token = now
        if request.conversation is not None:
            replica.store(request.conversation.text.keys)
        self.at(now + request.output_tokens / self.s.decode_rate, "decoded", request)
        self._next_prefill(now, replica)

    def _decoded(self, now: float, request: Request) -> None:
        replica, conversation, rng = self.replicas[request.root], request.conversation, self.rng
        replica.note_load(now, self.s.warmup)
        replica.running -= 1
        replica.active_tokens -= request.prompt_tokens + request.output_tokens
        if conversation is None:
            self._next_waiting(now, replica)
            self._outside(now, replica)  # the other client sends its next
            return
        if self.policy != "round_robin":
            self.gateways[request.gateway].ended(request.root)
        conversation.append(_message("assistant", rng, request.output_tokens))
        replica.store(conversation.text.keys)  # the reply's tokens were computed there
        self.done.append(request)
        conversation.turns_left -= 1
        if conversation.turns_left <= 0:
            conversation = self.new_conversation()
        else:
            conversation.append(_message("user", rng, rng.randint(200, 3000)))
        self.at(now + rng.uniform(1.0, 4.0), "send", conversation)
        self._next_waiting(now, replica)

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
        window = s.duration - s.warmup
        return {
            "requests": len(measured),
            "recomputed_mtok": (prompt - cached) / 1e6,
            "recomputed_per_request": (prompt - cached) / len(measured) if measured else 0.0,
            "hit_rate": cached / prompt if prompt else 0.0,
            "ttft_p50": _quantile(ttfts, 0.5),
            "ttft_p90": _quantile(ttfts, 0.9),
            "throughput_rps": len(measured) / window,
            "moved": self.moves / self.later_turns if self.later_turns else 0.0,
            "imbalance": max(loads) / (sum(loads) / len(loads)) if sum(loads) else 0.0,
            "decision_us": self.decision_seconds / self.decisions * 1e6 if self.decisions else 0.0,
        }


def decision_cost(replicas: int, repeat: int = 2000) -> dict[str, float]:
    """CPU µs of one routing decision for the benchmark's 80 KB claude-code request
    (bench/shapes.py): reading its prompt, choosing among `replicas` warm ones, noting it sent.
    A passed-through body's parts come from the `Envelope` the core reads for every such
    request, routed or not; that read is timed on its own (`envelope`)."""
    import shapes  # bench/shapes.py, beside this file

    anthropic_body = shapes.anthropic_body("claude-code", model="m", max_tokens=100, stream=True)
    parts = anthropic.ENVELOPE.decode(anthropic_body)
    bodies = {"translate": ("chat", shapes.openai_body("claude-code", model="m", max_tokens=100, stream=True)),
              "passthrough": (parts, anthropic_body)}  # fmt: skip
    roots = [f"http://10.0.0.{i + 1}:8000" for i in range(replicas)]
    out = {}
    for path, (kind, body) in bodies.items():
        placement = Placement(roots, "cache_aware", CacheRouting())
        for index, root in enumerate(roots):  # every replica holds the prompt: each match is a full search
            placement.sent(root, prompt_of(body, kind, None, placement.settings.block_bytes))  # type: ignore[arg-type]
            placement.report(root, 8 + index % 3, index % 2, 0.85 + index % 3 * 0.05, 1e9)  # and published its load
        started = time.process_time()
        for _ in range(repeat):
            prompt = prompt_of(body, kind, None, placement.settings.block_bytes)  # type: ignore[arg-type]
            root = placement.choose(roots, prompt).root
            placement.sent(root, prompt)
            placement.ended(root)
        out[path] = (time.process_time() - started) / repeat * 1e6
        out[path + "_bytes"] = len(body)
    started = time.process_time()
    for _ in range(repeat):
        anthropic.ENVELOPE.decode(anthropic_body)
    out["envelope"] = (time.process_time() - started) / repeat * 1e6
    return out


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


DEFAULT_CELLS = [(8, 128, 1), (8, 128, 3), (8, 64, 1), (32, 512, 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", help="comma-separated replica counts (default: the matrix below)")
    parser.add_argument("--conversations", help="comma-separated numbers of concurrent conversations")
    parser.add_argument("--gateways", default="1", help="comma-separated numbers of gateway replicas")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--duration", type=float, default=Settings.duration, help="simulated seconds per cell")
    parser.add_argument("--warmup", type=float, default=Settings.warmup)
    parser.add_argument("--cache-tokens", type=int, default=Settings.cache_tokens)
    parser.add_argument("--slots", type=int, default=Settings.slots)
    parser.add_argument("--prefill-rate", type=float, default=Settings.prefill_rate)
    parser.add_argument("--decode-rate", type=float, default=Settings.decode_rate)
    parser.add_argument("--seed", type=int, default=Settings.seed)
    parser.add_argument(
        "--outside",
        type=int,
        default=0,
        metavar="N",
        help="requests other clients keep in flight on each of the first quarter of the replicas",
    )
    parser.add_argument("--load-metrics", default="0", metavar="SECONDS",
                        help="comma-separated intervals at which gateways read the replicas' own load; 0: never")  # fmt: skip
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a cache_routing setting for this run (repeatable), e.g. --set load_tokens=256",
    )
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--decision-cost", action="store_true", help="only the CPU of one decision (8 and 32 replicas)")
    args = parser.parse_args(argv)
    if args.decision_cost:
        for replicas in (8, 32):
            cost = decision_cost(replicas)
            print(f"{replicas} replicas: {cost['translate']:.0f} µs translated ({cost['translate_bytes']:.0f} B body), "
                  f"{cost['passthrough']:.0f} µs passed through ({cost['passthrough_bytes']:.0f} B; the core's "
                  f"Envelope read of it, which every passed-through request pays: {cost['envelope']:.0f} µs)")  # fmt: skip
        return 0
    if args.replicas or args.conversations:
        cells = [(int(r), int(c), int(g)) for r in (args.replicas or "8").split(",")
                 for c in (args.conversations or "128").split(",") for g in args.gateways.split(",")]  # fmt: skip
    else:
        cells = DEFAULT_CELLS
    routing = {key: type(getattr(CacheRouting(), key))(value) for key, value in (s.split("=", 1) for s in args.set)}
    results = []
    print(f"{'replicas':>8} {'convs':>5} {'gw':>2} {'lm':>3} {'policy':<13} {'requests':>8} {'recomputed':>10} {'per req':>7} "
          f"{'hit':>5} {'ttft p50':>8} {'ttft p90':>8} {'req/s':>6} {'imbal':>5} {'moved':>5} {'µs/decision':>11}")  # fmt: skip
    for (replicas, conversations, gateways), metrics, policy in itertools.product(
        cells, [float(m) for m in args.load_metrics.split(",")], args.policies.split(",")
    ):
        if metrics and policy == "round_robin":
            continue  # nothing is read under round robin
        settings = Settings(replicas, conversations, gateways, args.duration, args.warmup, args.cache_tokens,
                            args.slots, args.prefill_rate, args.decode_rate, args.seed, routing, metrics,
                            args.outside)  # fmt: skip
        result = Fleet(settings, policy).run()
        results.append({"replicas": replicas, "conversations": conversations, "gateways": gateways,
                        "load_metrics": metrics, "policy": policy, **result})  # fmt: skip
        print(f"{replicas:>8} {conversations:>5} {gateways:>2} {metrics:>3g} {policy:<13} {result['requests']:>8} "
              f"{result['recomputed_mtok']:>9.1f}M {result['recomputed_per_request']:>7.0f} {result['hit_rate']:>5.2f} "
              f"{result['ttft_p50']:>7.2f}s {result['ttft_p90']:>7.2f}s {result['throughput_rps']:>6.1f} "
              f"{result['imbalance']:>5.2f} {result['moved']:>5.2f} {result['decision_us']:>11.0f}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"cells": results}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
