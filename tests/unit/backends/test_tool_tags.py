"""Passed-through tool ids that name their replica (backends/anthropic/tool_tags.py): tagged in
replies and streams, untagged in requests, on the bytes and only where they can be; and a
passthrough stream relayed by the pump with its tool_use id tagged, its other bytes untouched."""

from __future__ import annotations

import asyncio
import json

import pytest

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.anthropic.tool_tags import latest_tag, tagged_events, tagged_message, untagged
from dragoman.backends.shared import Shared
from dragoman.calls.types import Call, DirectWrites, Outcome
from dragoman.core.config_load import from_dict
from dragoman.translate.tool_ids import client_tool_id, replica_tag_of, tagged, upstream_tool_id
from dragoman.upstream.placement import replica_tag
from tests.support.passthrough_stream import BLOCK, DELTA, END, START, STOP, delta
from tests.support.responses import ReadyWriter, ScriptedResponse

TAG = "a1b2c3"


def _use(tool_id: str, tool_input: object = None) -> dict:
    return {"type": "tool_use", "id": tool_id, "name": "read", "input": tool_input or {}}


def _conversation(*ids: str) -> dict:
    messages: list[dict] = [{"role": "user", "content": "go"}]
    for tool_id in ids:
        messages += [{"role": "assistant", "content": [{"type": "text", "text": "ok"}, _use(tool_id)]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "x"}]}]  # fmt: skip
    return {"model": "m", "max_tokens": 9, "messages": messages}


@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "indented"])
@pytest.mark.parametrize(
    "separators", [(",", ":"), (", ", " : "), (",\n", "\t:\r\n ")], ids=["tight", "spaced", "lines"]
)
def test_tagged_ids_go_upstream_untagged_whatever_the_whitespace(indent, separators) -> None:
    body = _conversation(tagged("call_1", TAG), client_tool_id("functions.read:0", set(), TAG))
    sent = json.dumps(body, indent=indent, separators=separators).encode()
    expected = json.loads(json.dumps(_conversation("call_1", "functions.read:0")))
    assert json.loads(untagged(sent)) == expected


def test_only_an_id_or_tool_use_id_key_is_untagged_and_never_inside_a_string() -> None:
    quoted = json.dumps({"id": tagged("x", TAG)})  # a tool's text that quotes an id: escaped quotes
    body = {"model": "m", "messages": [
        {"role": "assistant", "content": [_use(tagged("c1", TAG), {"ref": tagged("c9", TAG), "note": quoted})]},
        {"role": "user", "content": [{"type": "text", "text": quoted}, {"type": "text", "text": 'a "id": "' + tagged("x", TAG)}]},
    ]}  # fmt: skip
    sent = untagged(json.dumps(body).encode())
    out = json.loads(sent)
    assert out["messages"][0]["content"][0]["id"] == "c1"
    assert out["messages"][0]["content"][0]["input"] == {"ref": tagged("c9", TAG), "note": quoted}
    assert out["messages"][1] == body["messages"][1]


def test_a_key_ending_in_id_after_an_escaped_quote_is_left() -> None:
    body = b'{"input":{"a\\"id":"' + tagged("c1", TAG).encode() + b'","xid":"' + tagged("c2", TAG).encode() + b'"}}'
    assert untagged(body) is body


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(_conversation("toolu_01A09q90qw90lq917835lq9", "call_1")).encode(),
        b'{"messages":[{"role":"user","content":"toolu_drabc"}]}',  # the prefix, but no tagged id
        b'{"id":"toolu_drXYZ123_no"}',  # no tag: not six hex digits
    ],
)
def test_a_body_without_tagged_ids_comes_back_itself(body: bytes) -> None:
    assert untagged(body) is body


def test_the_latest_tool_call_says_where_the_turn_before_went() -> None:
    older, newer = tagged("c1", "000001"), tagged("c2", TAG)
    body = json.dumps(_conversation(older, newer)).encode()
    assert latest_tag(body) == TAG
    untagged_last = json.dumps(_conversation(older, "c2")).encode()
    assert latest_tag(untagged_last) is None  # as the translating path reads it: the latest call, or nothing
    assert latest_tag(json.dumps(_conversation(older)).encode()) == "000001"


def test_a_reply_s_tool_use_ids_are_tagged_and_nothing_else() -> None:
    reply = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
             "content": [{"type": "text", "text": 'say "tool_use"'}, _use("call_1", {"id": "kept"}),
                         _use("functions.read:0"), _use(tagged("nested", "000001")), _use("toolu_b64_x")]}  # fmt: skip
    out = json.loads(tagged_message(json.dumps(reply).encode(), TAG))
    ids = [block.get("id") for block in out["content"]]
    assert out["id"] == "msg_1" and out["content"][1]["input"] == {"id": "kept"}
    assert ids[1:] == [tagged("call_1", TAG), client_tool_id("functions.read:0", set(), TAG),
                       client_tool_id(tagged("nested", "000001"), set(), TAG), client_tool_id("toolu_b64_x", set(), TAG)]  # fmt: skip
    assert ids[2].startswith(f"toolu_dr{TAG}_toolu_b64_") and ids[4] != tagged(
        "toolu_b64_x", TAG
    )  # encoded, as translated
    assert [upstream_tool_id(i) for i in ids[1:]] == [
        "call_1",
        "functions.read:0",
        tagged("nested", "000001"),
        "toolu_b64_x",
    ]
    sent_back = json.dumps({"messages": [{"role": "assistant", "content": out["content"]}]}).encode()
    assert [b.get("id") for b in json.loads(untagged(sent_back))["messages"][0]["content"]] == [
        None,
        *[b.get("id") for b in reply["content"][1:]],
    ]
    assert all(replica_tag_of(i) == TAG for i in ids[1:])
    text = json.dumps({"id": "msg_1", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}).encode()
    assert tagged_message(text, TAG) is text
    assert tagged_message(json.dumps(reply).encode(), "") == json.dumps(reply).encode()


TOOL_START = (
    b'event: content_block_start\r\ndata: {"type":"content_block_start","index":1,'
    b'"content_block":{"type":"tool_use","id":"call_7","name":"read","input":{}}}\r\n\r\n'
)
TOOL_END = END.replace(b'"end_turn"', b'"tool_use"')


def test_a_stream_s_tool_use_start_is_tagged_and_its_other_events_are_not() -> None:
    chunk = BLOCK + TOOL_START + delta('{"id": "x"}', "partial_json") + TOOL_END
    out = tagged_events(chunk, TAG)
    assert out == chunk.replace(b'"call_7"', b'"' + tagged("call_7", TAG).encode() + b'"')
    assert tagged_events(BLOCK + DELTA + TOOL_END, TAG) == BLOCK + DELTA + TOOL_END


def _relay(reads: list[bytes], replicas: list[str], *, direct: bool) -> tuple[list[bytes], str]:
    """The stream relayed by the pump for a backend with `replicas`, answered by the first."""
    url = "http://127.0.0.1:9"
    upstream = {"url": url, "replicas": replicas, "protocol": "anthropic"}
    config = from_dict({"upstreams": {"native": upstream}})
    backend = AnthropicBackend("native", config.upstreams["native"], config, Shared())  # type: ignore[arg-type]
    outcome = Outcome(request_id="req_1", endpoint="messages")
    outcome.replica = url
    call = Call(b"{}", "served", "served", {}, "req_1", True, outcome)
    writes = DirectWrites(ReadyWriter()) if direct else None

    async def run() -> list[bytes]:
        out = [chunk async for chunk in backend._relay(ScriptedResponse(reads), call, writes)]  # type: ignore[arg-type]
        return out if writes is None else out + writes.writer.written  # type: ignore[union-attr]

    return asyncio.run(run()), replica_tag(url)


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_a_relayed_stream_gets_its_replica_s_tag_and_its_text_goes_byte_for_byte(direct: bool) -> None:
    reads = [START, BLOCK, DELTA, STOP, TOOL_START, delta('{"path": "a"}', "partial_json"), TOOL_END]
    tagged_out, tag = _relay(reads, ["http://127.0.0.1:10"], direct=direct)
    plain_out, _ = _relay(reads, [], direct=direct)  # one replica: no tags
    assert b"".join(plain_out) == b"".join(reads)
    assert b"".join(tagged_out) == b"".join(reads).replace(b'"call_7"', b'"' + tagged("call_7", tag).encode() + b'"')
    text = [chunk for chunk in tagged_out if b"tool_use" not in chunk]  # each as it came, the same object
    assert [c for c in reads if c in text] == text and all(any(c is r for r in reads) for c in text[1:])
