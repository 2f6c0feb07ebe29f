"""ThreadStore: what a continuation is built from, and how long held conversations last."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dragoman.assembly.threads import ThreadError, ThreadNotFound, ThreadStore
from dragoman.calls.types import Outcome, Streaming


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 5, **fields}).encode()


def _create(store: ThreadStore, reply_id: str, text: str = "hi", owner: str = "") -> None:
    turn = store.open(_body(system="S", messages=[{"role": "user", "content": text}], thread={"type": "create"}), owner)
    turn.answered({"type": "message", "id": reply_id, "content": [{"type": "text", "text": "re: " + text}]})


def _continue(store: ThreadStore, previous: str, text: str = "more", owner: str = "", **fields: Any) -> Any:
    body = _body(
        messages=[{"role": "user", "content": text}],
        thread={"type": "continue", "previous_message_id": previous},
        **fields,
    )
    return store.open(body, owner)


def test_a_continuation_is_the_held_conversation_then_the_new_messages() -> None:
    store = ThreadStore()
    _create(store, "msg_1")
    turn = _continue(store, "msg_1", temperature=0.5)
    body = json.loads(turn.body)
    assert "thread" not in body and body["system"] == "S" and body["temperature"] == 0.5
    assert body["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "re: hi"}]},
        {"role": "user", "content": "more"},
    ]
    with pytest.raises(ThreadError) as in_flight:
        _continue(store, "msg_1")
    assert in_flight.value.details == {"error_code": "thread_continue_in_flight"}
    turn.answered({"type": "message", "id": "msg_2", "content": []})
    with pytest.raises(ThreadError) as again:
        _continue(store, "msg_1")
    assert again.value.details == {"error_code": "thread_already_continued"}
    assert len(json.loads(_continue(store, "msg_2").body)["messages"]) == 5


def test_a_turn_without_a_whole_reply_leaves_the_thread_as_it_was() -> None:
    store = ThreadStore()
    _create(store, "msg_1")
    _continue(store, "msg_1").answered(None)  # failed, or the client left
    assert len(json.loads(_continue(store, "msg_1").body)["messages"]) == 3


def test_held_conversations_expire_and_are_evicted_oldest_first_within_the_byte_budget() -> None:
    clock = Clock()
    store = ThreadStore(max_bytes=1600, held_for=60, clock=clock)  # room for two
    _create(store, "msg_old", "x" * 200)
    clock.now += 30
    _create(store, "msg_mid", "y" * 200)
    _create(store, "msg_new", "z" * 200)  # three do not fit: the oldest goes
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_old")
    _continue(store, "msg_mid").answered(None)
    clock.now += 61  # msg_new was held at 1030: expired at 1091
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_new")


def test_another_owner_cannot_continue_a_thread() -> None:
    store = ThreadStore()
    _create(store, "msg_1", owner="alice")
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_1", owner="bob")


def test_expired_threads_and_continued_marks_do_not_pile_up() -> None:
    clock = Clock()
    store = ThreadStore(max_bytes=10**9, held_for=60, clock=clock)
    _create(store, "msg_0")
    for turn in range(1, 50):  # one long thread: each turn leaves a mark on the one before
        _continue(store, f"msg_{turn - 1}").answered({"type": "message", "id": f"msg_{turn}", "content": []})
        clock.now += 1
    assert len(store) == 50
    clock.now += 61
    _create(store, "msg_new")  # holding anything sweeps what expired meanwhile
    assert len(store) == 1


def test_continued_marks_count_against_the_byte_budget() -> None:
    store = ThreadStore(max_bytes=30_000)
    _create(store, "msg_0")
    for turn in range(1, 200):
        _continue(store, f"msg_{turn - 1}").answered({"type": "message", "id": f"msg_{turn}", "content": []})
    assert len(store) < 100  # marks cost bytes too: the oldest went
    assert len(json.loads(_continue(store, "msg_199").body)["messages"]) > 0


def _sse(*events: dict[str, Any]) -> list[bytes]:
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


def _streamed_reply(reply_id: str, text_pieces: list[str], json_pieces: list[str]) -> list[bytes]:
    start = {
        "type": "message_start",
        "message": {"type": "message", "id": reply_id, "role": "assistant", "content": []},
    }
    text = [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in text_pieces
    ]
    tool = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    args = [{"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}}
            for p in json_pieces]  # fmt: skip
    return _sse(
        start, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, *text,
        {"type": "content_block_start", "index": 1, "content_block": tool}, *args, {"type": "message_stop"},
    )  # fmt: skip


def _watch(store: ThreadStore, chunks: list[bytes]) -> None:
    turn = store.open(_body(messages=[{"role": "user", "content": "hi"}], thread={"type": "create"}), "")

    async def relay() -> None:
        async def source() -> Any:
            for chunk in chunks:
                yield chunk

        reply = Streaming(source())
        outcome = Outcome(request_id="req_1", endpoint="messages")
        with outcome.finish:
            turn.follow(reply, outcome.finish)
            async for _ in reply.chunks:
                pass

    asyncio.run(relay())


def test_a_streamed_reply_in_many_pieces_is_held_whole() -> None:
    store = ThreadStore()
    _watch(store, _streamed_reply("msg_1", ["ab"] * 5000, ['{"a": "', *["cd"] * 5000, '"}']))
    held = json.loads(_continue(store, "msg_1").body)["messages"][1]["content"]
    assert held[0] == {"type": "text", "text": "ab" * 5000}
    assert held[1]["input"] == {"a": "cd" * 5000}


def test_a_streamed_reply_past_the_fold_cap_is_not_held() -> None:
    """A hostile upstream's endless stream must not grow a thread's memory without bound."""
    store = ThreadStore(max_folded=10_000)
    _watch(store, _streamed_reply("msg_1", ["x" * 100] * 101, []))
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_1")


def test_one_owner_filling_the_store_evicts_its_own_threads_not_anothers() -> None:
    store = ThreadStore(max_bytes=4000, max_owner_bytes=10**9)  # only the whole budget binds
    _create(store, "msg_alice", "a" * 200, owner="alice")
    for n in range(40):  # bob alone holds many times the budget
        _create(store, f"msg_bob_{n}", "b" * 200, owner="bob")
    _continue(store, "msg_alice", owner="alice").answered(None)  # alice's thread is still held
    _continue(store, "msg_bob_39", owner="bob").answered(None)  # bob keeps his newest
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_bob_0", owner="bob")


def test_an_owner_holds_at_most_its_own_budget() -> None:
    store = ThreadStore(max_bytes=10**9, max_owner_bytes=1600)  # room for two of one owner
    _create(store, "msg_bob", owner="bob")
    for n in range(3):
        _create(store, f"msg_alice_{n}", "a" * 200, owner="alice")
    with pytest.raises(ThreadNotFound):
        _continue(store, "msg_alice_0", owner="alice")
    _continue(store, "msg_alice_2", owner="alice").answered(None)
    _continue(store, "msg_bob", owner="bob").answered(None)


def test_without_keys_everyone_is_one_owner_with_the_whole_budget() -> None:
    store = ThreadStore(max_bytes=10**9, max_owner_bytes=1600)
    for n in range(3):
        _create(store, f"msg_{n}", "a" * 200)  # owner "": no keys
    _continue(store, "msg_0").answered(None)
