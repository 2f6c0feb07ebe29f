"""Cache-aware routing's pieces, deterministic: the prompt as routing sees it, the per-replica
prefix index, each conversation's home, and the choice (dragoman.upstream.placement)."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import msgspec
import pytest

from dragoman.core.config import CacheRouting
from dragoman.protocol import anthropic, openai
from dragoman.upstream.homes import Homes
from dragoman.upstream.placement import Placement, PrefixIndex, Prompt, prompt_of, replica_tag
from dragoman.upstream.replicas import Replicas

ROOTS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
BLOCK = 256
TOOLS = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 400, "parameters": {"type": "object"}}}
         for i in range(4)]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def chat_body(*turns: str, system: str = "You are a coding agent. " * 40, tools: Any = TOOLS) -> bytes:
    """A Chat Completions body as the translator encodes it (the ChatRequest struct)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for index, turn in enumerate(turns):
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": turn})
    request = msgspec.convert({"model": "m", "messages": messages, "tools": tools, "max_tokens": 100,
                               "stream": True}, openai.ChatRequest)  # fmt: skip
    return openai.ENCODER.encode(request)


def messages_body(*turns: str, spaced: bool = False) -> bytes:
    """An Anthropic body shaped like Claude Code's: messages first, the breakpoint on the last block."""
    messages = []
    for index, turn in enumerate(turns):
        messages.append(
            {"role": "user" if index % 2 == 0 else "assistant", "content": [{"type": "text", "text": turn}]}
        )
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {"model": "m", "messages": messages, "system": [{"type": "text", "text": "agent " * 200}],
            "tools": [{"name": "Bash", "description": "run " * 300, "input_schema": {"type": "object"}}],
            "max_tokens": 100}  # fmt: skip
    return json.dumps(body, separators=(", ", ": ") if spaced else (",", ":")).encode()


def prompt(body: bytes, kind: str = "chat", conversation: str | None = None) -> Prompt:
    result = prompt_of(body, kind, conversation, BLOCK)  # type: ignore[arg-type]
    assert result is not None
    return result


def shared(a: Prompt, b: Prompt) -> int:
    count = 0
    for x, y in zip(a.blocks, b.blocks, strict=False):
        if x != y:
            break
        count += 1
    return count


# -- the prompt ------------------------------------------------------------------------


def test_a_later_turn_repeats_every_block_of_the_turn_before_but_its_last_partial_one() -> None:
    first = prompt(chat_body("fix the bug in parser.py " * 30))
    second = prompt(chat_body("fix the bug in parser.py " * 30, "I read it. " * 50, "the test output " * 40))
    assert shared(first, second) >= len(first.blocks) - 1
    assert len(second.blocks) > len(first.blocks)


def test_tools_and_system_come_first_so_sessions_share_them() -> None:
    """The Chat Completions body has its tools last; routing reads them first, as a template
    renders them, so two conversations share every block of their tools and system prompt."""
    one, other = prompt(chat_body("one task " * 50)), prompt(chat_body("another task " * 50))
    common = len(json.dumps(TOOLS)) + len("You are a coding agent. " * 40)
    assert shared(one, other) >= common // BLOCK - 1
    assert one.blocks[-1] != other.blocks[-1]


def test_without_a_session_the_identity_is_the_conversation_up_to_its_first_user_turn() -> None:
    first = prompt(chat_body("task A " * 20))
    later = prompt(chat_body("task A " * 20, "done", "now the tests"))
    assert first.identity == later.identity
    assert prompt(chat_body("task B " * 20)).identity != first.identity
    assert prompt(chat_body("task A " * 20), conversation="session-1").identity == b"session-1"


def test_the_prompt_says_whether_it_is_the_conversations_first_turn() -> None:
    """How a gateway knows whether it is alone: behind several, most conversations it sees
    first are at a later turn."""
    assert prompt(chat_body("task A " * 20)).first_turn is True
    assert prompt(chat_body("task A " * 20, "done", "now the tests")).first_turn is False
    assert prompt(messages_body("task A " * 20), "messages").first_turn is True
    assert prompt(messages_body("task A " * 20, "ok", "next"), "messages").first_turn is False
    assert prompt(chat_body(), "chat").first_turn is None  # no user turn: not known


def test_a_moved_cache_breakpoint_does_not_break_an_anthropic_conversations_prefix() -> None:
    """Claude Code marks the last block of the newest turn; next turn that mark has moved on."""
    for spaced in (False, True):
        first = prompt(messages_body("read parser.py " * 80, spaced=spaced), "messages")
        second = prompt(messages_body("read parser.py " * 80, "ok " * 100, "next " * 100, spaced=spaced), "messages")
        assert shared(first, second) >= len(first.blocks) - 1


def test_the_parts_the_core_read_give_the_prompt_the_body_gives() -> None:
    """A passed-through body is read once (`Envelope`): routing's prompt from its parts is the
    one it reads from the body itself, blocks and identity alike."""
    for spaced in (False, True):
        body = messages_body("read parser.py " * 80, "ok " * 100, "next " * 100, spaced=spaced)
        parts = anthropic.ENVELOPE.decode(body)
        assert prompt_of(body, parts, None, BLOCK) == prompt(body, "messages")
        assert prompt_of(body, parts, "s-1", BLOCK) == prompt(body, "messages", "s-1")


def test_a_body_that_is_no_json_object_has_no_prompt() -> None:
    assert prompt_of(b"not json", "messages", None, BLOCK) is None
    assert prompt_of(b"[1, 2]", "messages", None, BLOCK) is None


# -- the prefix index --------------------------------------------------------------------


def test_the_index_matches_the_longest_prefix_it_was_sent() -> None:
    index = PrefixIndex(max_blocks=100, max_age=60)
    index.add([1, 2, 3], now=0)
    assert index.match([1, 2, 3, 4], now=1) == 3
    assert index.match([1, 2, 9], now=1) == 2
    assert index.match([7, 8], now=1) == 0


def test_the_index_is_bounded_least_recently_sent_first() -> None:
    index = PrefixIndex(max_blocks=4, max_age=60)
    index.add([1, 2], now=0)
    index.add([10, 11, 12], now=1)
    assert len(index) == 4
    assert index.match([1, 2], now=2) == 0  # block 1 went first
    index.add([10, 11, 12, 13, 14, 15], now=3)
    assert len(index) == 4


def test_blocks_older_than_max_age_are_not_believed_cached() -> None:
    index = PrefixIndex(max_blocks=100, max_age=60)
    index.add([1, 2], now=0)
    index.add([1], now=50)
    assert index.match([1, 2], now=100) == 1  # block 2 was last sent 100 s ago
    assert index.match([1, 2], now=111) == 0
    index.add([5], now=200)  # adding drops what aged out
    assert len(index) == 1


# -- homes ---------------------------------------------------------------------------------


def test_gateways_that_saw_the_same_conversations_in_any_order_agree_on_their_homes() -> None:
    clock = Clock()
    identities = [f"conversation-{i}".encode() for i in range(40)]
    one = Homes(ROOTS, spread=1.2, max_age=600, clock=clock)
    other = Homes(ROOTS, spread=1.2, max_age=600, clock=clock)
    for identity in identities:  # each sees them first at a later turn: behind several gateways
        one.order(identity, first_turn=False)
    for identity in reversed(identities):
        other.order(identity, first_turn=False)
    clock.now += 2  # both assign afresh, in one canonical order
    assert [one.order(i)[0] for i in identities] == [other.order(i)[0] for i in identities]


def test_no_replica_is_home_to_more_than_its_share() -> None:
    clock = Clock()
    homes = Homes(ROOTS, spread=1.2, max_age=600, clock=clock)
    identities = [f"c{i}".encode() for i in range(100)]
    for identity in identities:
        homes.order(identity)
    clock.now += 2
    counts = {root: 0 for root in ROOTS}
    for identity in identities:
        counts[homes.order(identity)[0]] += 1
    assert max(counts.values()) <= 30  # 1.2 x 100 / 4


@pytest.mark.parametrize("seed", range(20))
def test_a_few_conversations_are_shared_evenly(seed: int) -> None:
    """Four conversations on two replicas: two each, whatever their hashes (a replica whose
    cache holds two would drop one of three at every turn)."""
    clock = Clock()
    roots = [f"http://127.0.0.1:{40000 + seed * 7 + i}" for i in range(2)]
    homes = Homes(roots, spread=1.2, max_age=600, clock=clock)
    identities = [f"session-{seed}-{i}".encode() for i in range(4)]
    for identity in identities:
        homes.order(identity)
    for _ in range(2):  # as they came, and as assigned afresh
        assert sorted(Counter(homes.order(i)[0] for i in identities).values()) == [2, 2]
        clock.now += 2


def _started(count: int, first_turn: bool = True, clock: Clock | None = None) -> tuple[Clock, Homes, list[bytes]]:
    """A gateway's homes that have seen `count` conversations (c0, c1, ...) once each."""
    clock = clock or Clock()
    homes = Homes(ROOTS, spread=1.05, max_age=600, clock=clock)
    talks = [f"c{i}".encode() for i in range(count)]
    for identity in talks:
        homes.order(identity, first_turn=first_turn)
    return clock, homes, talks


def test_a_gateway_that_sees_every_conversation_from_its_first_turn_keeps_their_homes() -> None:
    """Alone, a home stays while it has room: assigned afresh, conversations that came since
    (and the room they change) would move some, each move a recomputed conversation."""
    clock, homes, first = _started(40)
    assert homes.alone
    clock.now += 2
    before = {identity: homes.order(identity)[0] for identity in first}
    for wave in range(3):
        for i in range(7):
            homes.order(f"new-{wave}-{i}".encode(), first_turn=True)
        clock.now += 2
        assert {identity: homes.order(identity)[0] for identity in first} == before
    counts = Counter(homes.order(identity)[0] for identity in list(homes._seen))
    assert max(counts.values()) <= math.ceil(1.05 * len(homes._seen) / len(ROOTS))


def test_a_gateway_with_few_conversations_is_alone_and_its_homes_follow_them() -> None:
    """Four conversations on two replicas: a gateway that waited for twenty first sights to
    find itself alone assigned homes afresh, and an untold turn went to the canonical home,
    away from its prefix. Seen from their first turns, they are kept where they went."""
    clock, homes, talks = _started(4)
    assert homes.alone
    home = homes.order(talks[0])[0]
    elsewhere = next(root for root in ROOTS if root != home)
    homes.went(talks[0], elsewhere)
    for _ in range(3):
        clock.now += 2
        assert homes.order(talks[0])[0] == elsewhere


def test_a_few_conversations_first_seen_at_later_turns_end_being_alone() -> None:
    _, homes, _ = _started(6, first_turn=False)
    assert not homes.alone


def test_alone_an_idle_conversation_holds_no_room_and_comes_back_to_its_home() -> None:
    """Ended conversations look idle: counted for max_age they would fill replicas that serve
    nothing. One idle for a while still finds its home, and its prefix there."""
    clock, homes, talks = _started(24)
    clock.now += 2
    idle = talks[0]
    home = homes.order(idle)[0]
    for _ in range(7):  # the others go on; `idle` is not seen for 70 s
        clock.now += 10
        for identity in talks[1:]:
            homes.order(identity)
    assert homes._active == len(talks) - 1
    assert homes.order(idle)[0] == home
    clock.now += 2
    assert homes.order(idle)[0] == home


def test_alone_a_home_follows_its_conversation_and_behind_several_it_does_not() -> None:
    """A conversation that went elsewhere (its home was busy) has its prefix there now: alone,
    that is its home, rather than one that would pull it back to be computed again. Behind
    several gateways homes stay the canonical assignment, on which they agree."""
    clock = Clock()
    for first_turn, follows in ((True, True), (False, False)):
        _, homes, talks = _started(24, first_turn, clock)  # alone is learnt over about 20 first sights
        assert homes.alone is follows
        home = homes.order(talks[0])[0]
        elsewhere = next(root for root in ROOTS if root != home)
        homes.went(talks[0], elsewhere)
        for _ in range(2):  # at once, and after the homes are assigned again
            assert homes.order(talks[0])[0] == (elsewhere if follows else home)
            clock.now += 2


def test_alone_homes_stay_when_the_room_shrinks_a_little() -> None:
    """Four of 40 conversations go idle, all from one replica: the room falls from 10 to 9, and
    the replicas still home to 10 keep them (each pushed out would be computed again)."""
    clock, homes, talks = _started(40)
    clock.now += 2
    before = {identity: homes.order(identity)[0] for identity in talks}
    assert sorted(Counter(before.values()).values()) == [10, 10, 10, 10]
    idle = [identity for identity in talks if before[identity] == ROOTS[0]][:4]
    for _ in range(4):  # the others go on; `idle` is not seen for 40 s
        clock.now += 10
        for identity in talks:
            if identity not in idle:
                homes.order(identity)
    assert homes._active == 36
    assert {i: homes.order(i)[0] for i in talks if i not in idle} == {i: before[i] for i in talks if i not in idle}


def test_gateways_that_see_conversations_first_at_later_turns_assign_homes_afresh() -> None:
    """Behind several gateways each sees most conversations first at a later turn: they keep
    the canonical assignment, on which gateways that saw the same conversations agree."""
    clock = Clock()
    one = Homes(ROOTS, spread=1.05, max_age=600, clock=clock)
    other = Homes(ROOTS, spread=1.05, max_age=600, clock=clock)
    identities = [f"conversation-{i}".encode() for i in range(40)]
    for index, identity in enumerate(identities):  # each sees a third first at their first turn
        one.order(identity, first_turn=index % 3 == 0)
    for index, identity in enumerate(reversed(identities)):
        other.order(identity, first_turn=index % 3 == 1)
    assert not one.alone and not other.alone
    clock.now += 2
    assert [one.order(i)[0] for i in identities] == [other.order(i)[0] for i in identities]


def test_homes_forget_conversations_not_seen_for_max_age_and_are_bounded() -> None:
    clock = Clock()
    homes = Homes(ROOTS, spread=1.2, max_age=60, clock=clock, max_conversations=10)
    for i in range(15):
        homes.order(f"c{i}".encode())
    assert len(homes._seen) == 10
    clock.now += 61
    homes.order(b"new")
    assert list(homes._seen) == [b"new"]


# -- the choice -----------------------------------------------------------------------------


def placement(policy: str = "cache_aware", clock: Clock | None = None, **settings: Any) -> Placement:
    routing = msgspec.structs.replace(CacheRouting(block_bytes=BLOCK), **settings)
    return Placement(ROOTS, policy, routing, clock=clock or Clock())  # type: ignore[arg-type]


def send(place: Placement, body: bytes, conversation: str | None = None, *, end: bool = True) -> str:
    request = prompt(body, conversation=conversation)
    decision = place.choose(ROOTS, request)
    place.sent(decision.root, request)
    if end:
        place.ended(decision.root)
    return decision.root


def test_every_turn_of_a_conversation_goes_where_the_turn_before_went() -> None:
    place = placement()
    turns = ["task " * 100]
    roots = set()
    for turn in range(6):
        roots.add(send(place, chat_body(*turns)))
        turns += [f"answer {turn} " * 50, f"tool output {turn} " * 80]
    assert len(roots) == 1


def test_a_conversation_not_on_its_home_stays_where_its_prefix_is() -> None:
    """When what it would recompute elsewhere costs more than leaving its home (home_tokens)."""
    place = placement(home_tokens=256)
    body = chat_body("task " * 100)
    request = prompt(body)
    elsewhere = place.homes.order(request.identity)[1]
    place.sent(elsewhere, request)  # it went elsewhere once (its home was busy)
    place.ended(elsewhere)
    decision = place.choose(ROOTS, prompt(chat_body("task " * 100, "ok " * 200, "more " * 300)))
    assert (decision.root, decision.reason) == (elsewhere, "prefix")
    assert decision.matched_tokens >= len(body) // 4 - BLOCK // 4


def test_a_hot_conversation_does_not_pile_onto_its_replica_while_others_idle() -> None:
    place = placement(balance_rel=1.5, balance_abs=2.0)
    body = chat_body("the same long task " * 100)
    held = [send(place, body, end=False) for _ in range(12)]
    assert len(set(held)) > 1  # past the bound, requests went elsewhere
    counts = [held.count(root) for root in ROOTS]
    assert max(counts) <= 12 / len(ROOTS) * 1.5 + 2 + 1


def test_first_turns_spread_over_the_replicas() -> None:
    place = placement()
    chosen = [send(place, chat_body(f"task number {i} " * 40)) for i in range(40)]
    assert set(chosen) == set(ROOTS)


def test_gateway_replicas_send_a_conversation_one_of_them_never_saw_to_the_same_replica() -> None:
    clock = Clock()
    one, other = placement(clock=clock), placement(clock=clock)
    turns = ["task " * 100]
    first = send(one, chat_body(*turns), "session-7")
    turns += ["answer " * 50, "tool output " * 80]
    assert send(other, chat_body(*turns), "session-7") == first


def test_the_decision_notes_what_it_expected_cached() -> None:
    place = placement()
    body = chat_body("task " * 100)
    send(place, body)
    decision = place.choose(ROOTS, prompt(body))
    assert decision.reason == "prefix"
    assert decision.matched_tokens == decision.prompt_tokens == prompt(body).tokens


def test_least_loaded_takes_the_replica_with_fewest_in_flight_ties_in_turn() -> None:
    place = placement("least_loaded")
    for root in ROOTS[:3]:
        place.sent(root, None)
    assert place.choose(ROOTS, None).root == ROOTS[3]
    place.sent(ROOTS[3], None)
    assert {place.choose(ROOTS, None).root for _ in range(8)} == set(ROOTS)


# -- the replicas' own load (their /metrics: dragoman.upstream.gauges) ------------------------


def report_all(place: Placement, running: float = 4, waiting: float = 0, kv_usage: float = 0.5) -> None:
    for root in ROOTS:
        place.report(root, running, waiting, kv_usage, 3.0)


def test_the_load_is_the_replicas_own_count_corrected_by_this_gateways_requests_since() -> None:
    clock = Clock()
    place = placement(clock=clock)
    root = ROOTS[0]
    place.sent(root, None)
    place.sent(root, None)
    place.report(root, running=5, waiting=3, kv_usage=None, fresh_for=3.0)  # 8, this gateway's 2 among them
    assert place.load(root, clock.now) == 8
    place.sent(root, None)  # one more since it was read
    assert place.load(root, clock.now) == 9
    for _ in range(3):
        place.ended(root)
    assert place.load(root, clock.now) == 6  # the other gateways' 6 remain
    place.sent(root, None)
    clock.now += 3.1
    assert place.load(root, clock.now) == 1  # too old to believe: this gateway's own in flight
    place.report(root, running=0, waiting=0, kv_usage=None, fresh_for=3.0)
    place.sent(root, None)
    assert place.load(root, clock.now) == 2  # never less than this gateway's own


@pytest.mark.parametrize("held", [False, True])
def test_where_prefixes_tie_a_conversation_goes_where_the_replicas_queue_is_shorter(held: bool) -> None:
    place = placement()
    request = prompt(chat_body("a task " * 100))
    home, second = place.homes.order(request.identity)[:2]
    if held:  # both hold its prompt (it was sent to each once): the same match
        for root in (home, second):
            place.sent(root, request)
            place.ended(root)
    assert place.choose(ROOTS, request).root == home
    report_all(place, running=8)
    place.report(home, running=8, waiting=12, kv_usage=0.5, fresh_for=3.0)  # other gateways' requests queue there
    decision = place.choose(ROOTS, request)
    assert (decision.root, decision.reason, decision.load) == (second, "load", 8)


@pytest.mark.parametrize(("waiting", "stays"), [(2, True), (12, False)])
def test_a_conversation_stays_on_its_prefix_unless_the_queue_there_is_much_longer(waiting: int, stays: bool) -> None:
    place = placement(home_tokens=0)  # only its prefix holds it there
    turns = ["a long task " * 6000]  # about 18k tokens
    there = send(place, chat_body(*turns))
    turns += ["answer " * 50, "tool output " * 80]
    report_all(place, running=4)
    place.report(there, running=4, waiting=waiting, kv_usage=0.5, fresh_for=3.0)
    decision = place.choose(ROOTS, prompt(chat_body(*turns)))
    assert (decision.root == there) is stays
    assert decision.reason == ("prefix" if stays else "load")


def test_a_replica_whose_kv_cache_is_nearly_full_costs_more() -> None:
    place = placement(home_tokens=1024)
    request = prompt(chat_body("a task " * 100))
    home, second = place.homes.order(request.identity)[:2]
    report_all(place)
    place.report(home, running=4, waiting=0, kv_usage=0.89, fresh_for=3.0)  # below kv_high: no more
    assert place.choose(ROOTS, request).root == home
    place.report(home, running=4, waiting=0, kv_usage=0.99, fresh_for=3.0)
    assert place.choose(ROOTS, request).root == second


def test_the_load_bound_counts_every_gateways_requests_on_a_replica() -> None:
    place = placement()
    body = chat_body("the same long task " * 100)
    there = send(place, body)
    report_all(place, running=2)
    place.report(there, running=30, waiting=0, kv_usage=0.5, fresh_for=3.0)  # other gateways keep it busy
    decision = place.choose(ROOTS, prompt(body))
    assert decision.root != there and decision.reason == "load"


def test_least_loaded_counts_what_the_replicas_say_they_run() -> None:
    place = placement("least_loaded")
    report_all(place, running=10)
    place.report(ROOTS[2], running=2, waiting=1, kv_usage=None, fresh_for=3.0)
    decision = place.choose(ROOTS, None)
    assert (decision.root, decision.load) == (ROOTS[2], 3)


# -- with failover (Replicas) ------------------------------------------------------------------


def replicas(clock: Clock) -> Replicas:
    return Replicas("up", ROOTS, trial_for=5.0, clock=clock, placement=placement(clock=clock))


def test_a_replica_passed_over_is_not_chosen_even_holding_the_prefix() -> None:
    clock = Clock()
    fleet = replicas(clock)
    assert fleet.placement is not None
    request = prompt(chat_body("task " * 100))
    root = fleet.place(prompt=request).root
    fleet.placement.sent(root, request)
    fleet.failed(root, silent=False)
    assert fleet.place(prompt=request).root != root
    assert fleet.place(avoid=ROOTS[0], prompt=request).root != ROOTS[0]


@pytest.mark.parametrize("silent", [False, True])
def test_a_replica_that_comes_back_is_warmed_not_flooded(silent: bool) -> None:
    """It failed: its cache is presumed lost. Conversations that moved on while it was out
    stay where their prefix now is; it takes new ones."""
    clock = Clock()
    fleet = replicas(clock)
    placement = fleet.placement
    assert placement is not None
    conversations = [chat_body(f"task {i} " * 60) for i in range(12)]
    first = {}
    for index, body in enumerate(conversations):
        request = prompt(body)
        first[index] = fleet.place(prompt=request).root
        placement.sent(first[index], request)
        placement.ended(first[index])
    down = first[0]
    fleet.failed(down, silent=silent)
    moved = {}
    for index, body in enumerate(conversations):
        if first[index] == down:
            request = prompt(body)
            moved[index] = fleet.place(prompt=request).root
            assert moved[index] != down
            placement.sent(moved[index], request)
            placement.ended(moved[index])
    clock.now += 120  # its cool-down is over
    fleet.answered(down)
    for index in moved:
        longer = prompt(chat_body(f"task {index} " * 60, "ok " * 40, "go on " * 40))
        assert fleet.place(prompt=longer).root == moved[index]


def test_a_retry_that_leaves_a_conversations_home_does_not_move_the_conversation() -> None:
    """Left once (a 502 retried elsewhere) is not out: the next turn goes home again."""
    clock = Clock()
    fleet = replicas(clock)
    assert fleet.placement is not None
    body = chat_body("task " * 100)
    home = fleet.place(prompt=prompt(body)).root
    assert fleet.place(avoid=home, prompt=prompt(body)).root != home
    assert fleet.place(prompt=prompt(chat_body("task " * 100, "ok", "next"))).root == home


def test_a_cache_routing_setting_out_of_range_is_a_start_up_error_naming_it() -> None:
    from dragoman.core.config import ConfigError
    from dragoman.core.config_load import from_dict

    upstream = {"url": "http://127.0.0.1:8000/v1", "replicas": ["http://127.0.0.1:8001/v1"]}
    with pytest.raises(ConfigError, match=r"upstreams\.u\.cache_routing\.block_bytes: must be positive, got 0"):
        from_dict({"upstreams": {"u": {**upstream, "cache_routing": {"block_bytes": 0}}}})
    with pytest.raises(ConfigError, match=r"upstreams\.u\.cache_routing\.kv_high: must be from 0 to less than 1"):
        from_dict({"upstreams": {"u": {**upstream, "cache_routing": {"kv_high": 1.0}}}})
    with pytest.raises(ConfigError, match=r"upstreams\.u\.load_metrics_interval: must be a positive number"):
        from_dict({"upstreams": {"u": {**upstream, "load_metrics_interval": 0}}})
    with pytest.raises(ConfigError, match=r"upstreams\.u\.load_metric: unknown key \(did you mean load_metrics\?\)"):
        from_dict({"upstreams": {"u": {**upstream, "load_metric": False}}})
    with pytest.raises(ConfigError, match=r"upstreams\.u\.routing"):
        from_dict({"upstreams": {"u": {**upstream, "routing": "random"}}})
    assert from_dict({"upstreams": {"u": upstream}}).upstreams["u"].routing is None  # cache_aware, with replicas


def test_a_gateway_sends_a_turn_where_the_request_says_its_turn_before_went() -> None:
    """Two gateway processes that share nothing: one sent every conversation's first turn, the
    other gets their second turns. Told where each first turn went (its tool ids say:
    translate/tool_ids.py), it sends each there; not told, it would send some elsewhere, each
    to be computed again."""
    clock = Clock()
    first, second, blind = (placement(clock=clock) for _ in range(3))
    talks = [f"session-{i}" for i in range(40)]
    went = {}
    for talk in talks:
        went[talk] = send(first, chat_body(f"{talk} task " * 60), talk, end=False)
    clock.now += 2
    told, guessed = {}, {}
    for talk in talks:
        body = chat_body(f"{talk} task " * 60, "done " * 20, "result " * 80)
        told[talk] = second.choose(ROOTS, prompt_of(body, "chat", talk, BLOCK, went[talk])).root  # type: ignore[union-attr]
        guessed[talk] = blind.choose(ROOTS, prompt(body, conversation=talk)).root
    assert told == went
    assert guessed != went
    assert second.homes.kept and not blind.homes.kept  # most later turns said where they were before


def test_replica_tags_name_a_replica_in_every_gateway_process() -> None:
    one, other = placement(), placement()
    tags = [replica_tag(root) for root in ROOTS]
    assert len(set(tags)) == len(ROOTS) and all(len(tag) == 6 for tag in tags)
    assert [one.root_of(tag) for tag in tags] == [other.root_of(tag) for tag in tags] == ROOTS
    assert one.root_of("000000") is None and one.root_of(None) is None
    assert one.tag(ROOTS[1]) == tags[1] and one.tag("http://elsewhere:1") == "" and one.tag(None) == ""
    assert placement("least_loaded").tag(ROOTS[1]) == ""  # nothing reads them back
    assert one.tags and not placement("least_loaded").tags
    alone = Placement(ROOTS[:1], "cache_aware", CacheRouting(block_bytes=BLOCK))
    assert not alone.tags and alone.tag(ROOTS[0]) == ""  # no other replica to tell it from


def test_an_envelope_that_read_the_tools_for_routes_facts_gives_the_prompt_the_body_does():
    from dragoman.routes.shape import routed_envelope

    body = json.dumps({"model": "m", "tools": [{"name": "t", "input_schema": {}}], "system": "s",
                       "messages": [{"role": "user", "content": "hi " * 200}]}).encode()  # fmt: skip
    envelope = msgspec.json.Decoder(routed_envelope((), facts=True)).decode(body)
    assert prompt_of(body, envelope, None, 64) == prompt_of(body, "messages", None, 64)
