"""Which of an upstream's free replicas a request goes to: least loaded, or cache aware.

Round robin stays with `dragoman.upstream.replicas`, which also decides which replicas are
free (failover, cool-downs, trials): a policy here only chooses among those.

Cache aware (docs/routing.md): a backend keeps the prompts it computed recently in its
prefix cache (vLLM, SGLang, llama-server's slots). The gateway remembers, per replica, the
prompts it sent there as chained hashes of fixed-size blocks (`PrefixIndex`), so a block's
hash stands for everything before it. A request costs, on each replica, the prompt tokens
that replica would have to compute again plus a price per request it already has (`load`),
plus a price per step away from the conversation's home (`dragoman.upstream.homes`), high
enough that gateway replicas that know nothing of a conversation still send it where the
others do. A replica far above the mean load takes nothing while another is below it.

Behind replicas, the tool ids of a translated reply name the replica that made them
(`replica_tag`, translate/tool_ids.py); the client sends them back with every later turn,
so a gateway process learns where a conversation's turn before went even when another
process sent it (`Prompt.previous`): that replica holds the conversation, and comes first.

A replica's load is the requests this gateway has in flight there, or, where the replica
publishes its own (`dragoman.upstream.gauges` reads them in the background), what it said it
was running and queueing, every gateway's requests together, corrected by this gateway's own
since it said so. A queue and a nearly full KV cache it published cost more (`surcharge`).
"""

from __future__ import annotations

import itertools
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec
import xxhash

from dragoman.core.config import CacheRouting, Routing
from dragoman.upstream.homes import Homes

BYTES_PER_TOKEN = 4  # prompt bytes per token, for costs and metrics (JSON text of code and prose)
PromptKind = Literal["chat", "messages"]  # a Chat Completions body, an Anthropic Messages body


class MessagesParts(Protocol):
    """An Anthropic Messages body's prompt parts, undecoded, as the core read them already
    (`protocol.anthropic.Envelope`): routing need not read the body again."""

    model: str
    messages: list[msgspec.Raw]
    tools: msgspec.Raw
    system: msgspec.Raw


_hash = xxhash.xxh3_64_intdigest  # deterministic across processes: gateway replicas agree on it


def replica_tag(root: str) -> str:
    """A replica's tag in the tool ids it makes (translate/tool_ids.py): the same in every
    gateway process configured with the same URL."""
    return f"{_hash(root.encode()) & 0xFFFFFF:06x}"


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's prompt as routing sees it: in prompt order (tools, system, messages)."""

    blocks: list[int]  # chained hashes of its fixed-size blocks
    size: int  # bytes
    identity: bytes  # the conversation: its session, else a hash of everything to its first user turn
    first_turn: bool | None = None  # nothing after its first user turn (None: not known)
    previous: str | None = None  # the replica its turn before went to, where the request says so

    @property
    def tokens(self) -> int:
        return self.size // BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request went and why (for the access log and the metrics)."""

    root: str
    reason: str  # prefix | home | load | least_loaded | only | round_robin
    matched_tokens: int = 0
    prompt_tokens: int = 0
    load: float | None = None  # the replica's load as routing counted it (`Placement.load`)


@dataclass(slots=True)
class Reported:
    """What a replica last published about its load, as routing uses it."""

    requests: float  # running and waiting, every gateway's
    own: int  # this gateway's requests in flight there when it was read
    surcharge: float  # tokens: its queue and KV cache's price (`Placement.report`)
    until: float  # believed until then


class _Segments(msgspec.Struct):
    """The parts of a Messages body that make its prompt, left undecoded."""

    model: str = ""
    messages: list[msgspec.Raw] = []
    tools: msgspec.Raw = msgspec.Raw(b"")
    system: msgspec.Raw = msgspec.Raw(b"")


_SEGMENTS = msgspec.json.Decoder(_Segments)
# Anthropic breakpoints move to the newest turn each time: the turn before lost its marker.
_CACHE_CONTROL = re.compile(rb'"cache_control"\s*:\s*\{[^{}]*\}')
_SYSTEM_ROLE = re.compile(rb'^\{\s*"role"\s*:\s*"system"')


def prompt_of(
    body: bytes,
    kind: PromptKind | MessagesParts,
    conversation: str | None,
    block_bytes: int,
    previous: str | None = None,
) -> Prompt | None:
    """The prompt of a request body as sent upstream (or of its parts, read already); None if
    it is no JSON object. `previous`: the replica its turn before went to, if the request said."""
    if kind == "chat":
        ordered = _chat_order(body)
    elif kind == "messages":
        ordered = _messages_order(body)
    elif isinstance(kind.tools, msgspec.Raw) and isinstance(kind.system, msgspec.Raw):
        ordered = _parts_order(kind)
    else:  # an envelope that read them for routes' facts alone (`routes.shape.routed_envelope`)
        ordered = _messages_order(body)
    if ordered is None:
        return None
    data, opening, first_turn = ordered
    view = memoryview(data)
    identity = conversation.encode() if conversation else _hash(view[:opening]).to_bytes(8, "little")
    blocks = []
    chained = 0
    for start in range(0, len(data), block_bytes):
        chained = _hash(view[start : start + block_bytes], chained)
        blocks.append(chained)
    return Prompt(blocks, len(data), identity, first_turn, previous)


def _chat_order(body: bytes) -> tuple[bytes, int, bool | None] | None:
    """A Chat Completions body as dragoman's translator encodes it (compact, `messages` before
    `tools`, each message's `role` first), tools first, without decoding it: no key can hide in
    a string, whose quotes are escaped. Returns the bytes, where its first user turn ends, and
    whether that turn is the last."""
    tools = body.rfind(b',"tools":[')
    data = body[tools:] + body[:tools] if tools > 0 else body
    user = data.find(b'{"role":"user"')
    if user < 0:
        return data, len(data), None
    end = data.find(b',{"role":"', user)  # the next message; else the end of the list
    return (data, end, False) if end > 0 else (data, data.rfind(b"}]", user) + 1, True)


def _messages_order(body: bytes) -> tuple[bytes, int, bool | None] | None:
    """An Anthropic Messages body, whatever its formatting: tools, system, then messages."""
    try:
        return _parts_order(_SEGMENTS.decode(body))
    except msgspec.DecodeError:
        return None


def _parts_order(segments: MessagesParts) -> tuple[bytes, int, bool | None]:
    messages: list[bytes | msgspec.Raw] = list(segments.messages)
    for index in range(max(0, len(messages) - 2), len(messages)):
        messages[index] = _CACHE_CONTROL.sub(b"", bytes(messages[index]))
    first_user = next((i for i, m in enumerate(messages) if not _SYSTEM_ROLE.match(m)), len(messages) - 1)
    model = segments.model.encode()
    opening = len(model) + len(segments.tools) + len(segments.system) + sum(len(m) for m in messages[: first_user + 1])
    first_turn = first_user == len(messages) - 1 if messages else None
    return b"".join([model, segments.tools, segments.system, *messages]), opening, first_turn


class PrefixIndex:
    """The prompt blocks recently sent to one replica: at most `max_blocks` (least recently
    sent dropped first), each believed cached for `max_age` seconds after it was last sent.
    About 125 bytes a block (an OrderedDict entry: 64-bit int key, float time)."""

    __slots__ = ("_blocks", "_max_age", "_max_blocks")

    def __init__(self, max_blocks: int, max_age: float) -> None:
        self._blocks: OrderedDict[int, float] = OrderedDict()
        self._max_blocks = max_blocks
        self._max_age = max_age

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int], now: float) -> int:
        """How many leading `blocks` are held. A chained block held means its prefix was
        sent, so the held ones form a prefix: a binary search finds its end."""
        held, oldest = self._blocks, now - self._max_age
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high + 1) // 2
            sent = held.get(blocks[middle - 1])
            if sent is not None and sent >= oldest:
                low = middle
            else:
                high = middle - 1
        return low

    def add(self, blocks: Sequence[int], now: float) -> None:
        held = self._blocks
        for block in blocks:
            held[block] = now
            held.move_to_end(block)
        oldest = now - self._max_age
        while held and (len(held) > self._max_blocks or next(iter(held.values())) < oldest):
            held.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


class Placement:
    """The choice among free replicas for one upstream, and what it needs to remember:
    requests in flight per replica (from this gateway process) and, for cache_aware, each
    replica's PrefixIndex."""

    def __init__(
        self,
        roots: list[str],
        policy: Routing,
        settings: CacheRouting,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self._clock = clock
        self.in_flight = dict.fromkeys(roots, 0)
        self.reported: dict[str, Reported] = {}  # by replica: its own figures (`report`)
        self.indexes = {root: PrefixIndex(settings.max_blocks, settings.max_age) for root in roots}
        self.homes = Homes(
            roots, spread=settings.spread, shared_spread=settings.shared_spread, max_age=settings.max_age, clock=clock
        )
        self._turn = itertools.cycle(range(len(roots)))
        tags = [replica_tag(root) for root in roots]
        self._by_tag = {tag: root for tag, root in zip(tags, roots, strict=True) if tags.count(tag) == 1}

    def root_of(self, tag: str | None) -> str | None:
        """The replica with this tag (`replica_tag`), if it is one of these."""
        return None if tag is None else self._by_tag.get(tag)

    def tag(self, root: str | None) -> str:
        """The tag for the tool ids `root` makes, where routing reads them back (cache aware, with
        replicas to choose among)."""
        if root is None or not self.tags or root not in self._by_tag.values():
            return ""
        return replica_tag(root)

    @property
    def tags(self) -> bool:
        """Whether the tool ids its replicas make are tagged (`tag`): cache aware, with replicas."""
        return self.policy == "cache_aware" and len(self.in_flight) > 1

    def wants_prompt(self) -> bool:
        return self.policy == "cache_aware"

    def report(self, root: str, running: float, waiting: float, kv_usage: float | None, fresh_for: float) -> None:
        """`root` published its own load: believed for `fresh_for` seconds. Its price beyond
        the requests is computed here, once, not per request: `queue_tokens` a waiting request,
        and up to `kv_tokens` for a KV cache fuller than `kv_high` (it will queue or preempt,
        and evict the prefixes it holds, soon)."""
        settings = self.settings
        surcharge = settings.queue_tokens * waiting
        if kv_usage is not None and kv_usage > settings.kv_high:
            surcharge += settings.kv_tokens * min(1.0, (kv_usage - settings.kv_high) / (1.0 - settings.kv_high))
        own = self.in_flight[root]
        self.reported[root] = Reported(running + waiting, own, surcharge, self._clock() + fresh_for)

    def load(self, root: str, now: float) -> float:
        """Requests on `root`: this gateway's in flight or, while believed, what the replica
        published, every gateway's, plus this gateway's own since (those it ended since,
        less). Never less than this gateway's own: the reading may predate them."""
        return self._loads([root], now)[0][root]

    def _loads(self, candidates: list[str], now: float) -> tuple[dict[str, float], dict[str, float]]:
        """`load` of each candidate, and the surcharge of those whose figures are believed (in one
        pass: with 32 replicas, a method call each was a tenth of a decision's time)."""
        in_flight, reported = self.in_flight, self.reported
        loads: dict[str, float] = {}
        surcharges: dict[str, float] = {}
        for root in candidates:
            load: float = in_flight[root]
            seen = reported.get(root)
            if seen is not None and now <= seen.until:
                published = seen.requests + load - seen.own
                if published > load:
                    load = published
                surcharges[root] = seen.surcharge
            loads[root] = load
        return loads, surcharges

    def choose(self, candidates: list[str], prompt: Prompt | None, avoid: str | None = None) -> Decision:
        """Among the free `candidates` (`avoid`, the one a retry leaves, is not out: only left)."""
        tokens = prompt.tokens if prompt else 0
        if len(candidates) == 1:
            return Decision(candidates[0], "only", 0, tokens, self.load(candidates[0], self._clock()))
        if self.policy != "cache_aware" or prompt is None:
            root, load = self._least_loaded(candidates)
            return Decision(root, "least_loaded", 0, tokens, load)
        return self._cache_aware(candidates, prompt, avoid)

    def _least_loaded(self, candidates: list[str]) -> tuple[str, float]:
        now = self._clock()
        start = next(self._turn) % len(candidates)  # ties taken in turn
        loads = self._loads(candidates[start:] + candidates[:start], now)[0]  # in that order
        root = min(loads, key=loads.__getitem__)
        return root, loads[root]

    def _cache_aware(self, candidates: list[str], prompt: Prompt, avoid: str | None) -> Decision:
        settings, now = self.settings, self._clock()
        loads, surcharges = self._loads(candidates, now)
        cap = sum(loads.values()) / len(loads) * settings.balance_rel + settings.balance_abs
        # The conversation's home, then its rendezvous order: what every gateway replica computes.
        previous = prompt.previous if prompt.previous in self.in_flight else None
        ranked = self.homes.order(prompt.identity, prompt.first_turn, previous)
        order = [root for root in ranked if root in loads]
        eligible = [root for root in order if loads[root] <= cap] or order
        block_tokens = settings.block_bytes // BYTES_PER_TOKEN
        indexes, tokens = self.indexes, prompt.tokens
        matches = [min(indexes[root].match(prompt.blocks, now) * block_tokens, tokens) for root in eligible]
        if previous is not None and previous in eligible:  # it holds the turn before, whoever sent it: the most
            matches[eligible.index(previous)] = max(matches)
        rank = {root: position for position, root in enumerate(order)}
        costs = [
            tokens - matched + settings.load_tokens * loads[root] + surcharges.get(root, 0.0)
            + settings.home_tokens * rank[root]
            for root, matched in zip(eligible, matches, strict=True)
        ]  # fmt: skip
        chosen = costs.index(min(costs))
        root, matched = eligible[chosen], matches[chosen]
        if ranked[0] not in loads and ranked[0] != avoid:
            self.homes.pin(prompt.identity, root)  # its home is out (passed over): this is its home now
        elif root != ranked[0] and ranked[0] != avoid:  # a retry leaving home once does not move it
            self.homes.went(prompt.identity, root)  # alone, its home follows it (`Homes.went`)
        if matched and matches.count(matched) == 1 and matched == max(matches):
            reason = "prefix"  # the only replica holding this much of the prompt
        elif root == order[0]:
            reason = "home"
        else:
            reason = "load"
        return Decision(root, reason, matched, prompt.tokens, loads[root])

    def sent(self, root: str, prompt: Prompt | None) -> None:
        """A request went to `root`: one more in flight, and its prompt is (soon) cached there."""
        self.in_flight[root] += 1
        if prompt is not None and self.policy == "cache_aware":
            self.indexes[root].add(prompt.blocks, self._clock())

    def ended(self, root: str) -> None:
        self.in_flight[root] = max(0, self.in_flight[root] - 1)

    def forget(self, root: str) -> None:
        """`root` failed: a server that restarts comes back with an empty cache."""
        self.indexes[root].clear()
