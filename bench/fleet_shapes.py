"""The simulated fleet's workloads (bench/fleet.py): Claude-Code-shaped conversations, and the
shapes of a fleet's traffic that routing must do well in (issue 36).

Every shape is given for 8 replicas; at N replicas its conversations (or arrival rate) are
scaled by N / 8, and each replica's cache stays the same.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from dragoman.upstream.placement import BYTES_PER_TOKEN

BLOCK_TOKENS = 64  # the replicas' cache granularity (vLLM's default block is 16 tokens; coarser is faster here)
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN
COMPACT = (",", ":")  # as dragoman's translator encodes a body (routing reads its messages' roles)


@dataclass(frozen=True)
class Shape:
    """A workload. `arrivals`: `spread` starts every conversation in the first 10 s and
    replaces each as it ends (fixed concurrency); `together` starts them all in the first
    0.5 s and replaces none; `poisson` starts them at `rate` a second (per 8 replicas),
    replacing none."""

    about: str
    conversations: int = 128  # per 8 replicas; none with `poisson`
    arrivals: str = "spread"
    rate: float = 0.0
    turns: tuple[int, int] = (6, 20)
    long_share: float = 0.0  # of the conversations, the long ones: `long_turns` turns of `long_user` tokens
    long_turns: tuple[int, int] = (0, 0)
    long_user: tuple[int, int] = (0, 0)
    first: tuple[int, int] = (200, 800)  # tokens of a conversation's own first user turn
    user: tuple[int, int] = (200, 3000)  # tokens each later user turn (a tool result) adds
    tools: tuple[int, ...] = (14_000, 6_000, 6_000, 6_000)  # the variants' tools: the main one, then sub-agents
    system: int = 2_000
    main_share: float = 0.75  # of the conversations, those on the main variant
    output: tuple[int, int] = (100, 500)  # tokens of each reply, kept in the conversation
    think: tuple[float, float] = (1.0, 4.0)  # seconds between a reply and the next turn
    warm: bool = False  # every replica holds the shared prefixes before the first turn
    cache_tokens: int = 400_000
    gateways: int = 1
    duration: float = 200.0
    warmup: float = 40.0


SHAPES = {
    "steady": Shape("128 conversations at once, each replaced as it ends (the cells of issue 21)"),
    "together": Shape(
        "24 conversations of 8 turns starting together, caches holding about three conversations",
        conversations=24, arrivals="together", turns=(8, 8), cache_tokens=100_000, duration=900.0, warmup=0.0,
    ),
    "skewed": Shape(
        "128 at once: 8 % very long (40-60 turns of 1-4k tokens), the rest short (3-8 turns)",
        turns=(3, 8), long_share=0.08, long_turns=(40, 60), long_user=(1_000, 4_000),
    ),
    "churn": Shape(
        "Poisson arrivals, 1.1 conversations a second; each ends after 6-20 turns",
        conversations=0, arrivals="poisson", rate=1.1, duration=300.0, warmup=100.0,
    ),
    "prefix": Shape(
        "128 at once sharing one 40k-token system prompt and tools, short turns: most of each prompt shared",
        tools=(36_000,), system=4_000, main_share=1.0, first=(100, 400), user=(100, 600),
    ),
    "gateways": Shape("the steady shape through three gateway replicas that share nothing", gateways=3),
    "replicas": Shape(  # bench/replicas.py's replay (docs/performance-history.md), at 2 replicas
        "4 conversations of 4 turns at once, 4-token replies, caches holding two conversations (slots)",
        conversations=16, arrivals="together", turns=(4, 4), first=(120, 120), user=(206, 206), tools=(0,),
        system=285, output=(4, 4), think=(0.0, 1.0), warm=True, cache_tokens=2_240, duration=3_600.0, warmup=0.0,
    ),
}  # fmt: skip
MATRIX = ("together", "skewed", "churn", "prefix", "gateways")  # `--shape all`, each at 8 and 32 replicas


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


def variants(rng: random.Random, shape: Shape) -> list[Variant]:
    out = []
    for tools_tokens in shape.tools:
        tools = json.dumps([{"type": "function", "function": {"name": "t", "description": _filler(rng, tools_tokens)}}])
        system = json.dumps({"role": "system", "content": _filler(rng, shape.system)}, separators=COMPACT)
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
    user: tuple[int, int]  # tokens of each later user turn
    replica: str = ""  # where its last turn went

    def body(self) -> bytes:
        messages = b",".join([self.variant.system, *self.messages])
        return b'{"model":"m","messages":[' + messages + b'],"tools":' + self.variant.tools + b"}"

    def append(self, message: bytes) -> None:
        self.messages.append(message)
        self.text.add(message)


def message(role: str, rng: random.Random, tokens: int) -> bytes:
    return json.dumps({"role": role, "content": _filler(rng, tokens)}, separators=COMPACT).encode()


def conversation(shape: Shape, kinds: list[Variant], rng: random.Random, session: str) -> Conversation:
    """A new conversation of `shape`: its variant, length, and first user turn."""
    variant = kinds[0] if len(kinds) == 1 or rng.random() < shape.main_share else kinds[rng.randrange(1, len(kinds))]
    long = shape.long_share and rng.random() < shape.long_share
    turns, user = (shape.long_turns, shape.long_user) if long else (shape.turns, shape.user)
    talk = Conversation(variant, session, rng.randint(*turns), [], variant.text.copy(), user)
    talk.append(message("user", rng, rng.randint(*shape.first)))
    return talk
