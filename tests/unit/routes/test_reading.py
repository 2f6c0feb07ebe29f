"""How a shape reads a request at the least cost, without changing what it reads: tests
cheapest first, facts once, the headers in one pass, large parts once per distinct bytes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from starlette.datastructures import Headers

from dragoman.routes.conditions import compile_when
from dragoman.routes.memo import SMALLEST, Memo
from dragoman.routes.reading import Reader, flagged_system, header_names, picked, tool_facts
from dragoman.routes.shape import Shape, routed_envelope

ROUTED = msgspec.json.Decoder(routed_envelope(()))
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.a7e; cc_entrypoint=cli;"


def routed(reader: Reader | None = None, headers: Any = None, **body: Any) -> Shape:
    raw = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **body}).encode()
    return Shape("m", headers or {}, raw, ROUTED.decode(raw), reader or Reader())


def test_a_table_stops_at_its_first_failing_test_whatever_order_it_was_written_in():
    shape = routed()
    assert compile_when({"images": True, "tools": 0, "model": "claude-*"}, "w").holds(shape) is False
    assert "images" not in vars(shape) and "tool_count" not in vars(shape)  # the model decided: nothing read
    assert compile_when({"images": False, "model": "m"}, "w").holds(shape) is True
    assert vars(shape)["images"] is False  # read once, then an attribute


def test_an_any_stops_at_its_first_option_that_holds():
    shape = routed(headers={"x-priority": "1"}, tools=[{"name": "t", "input_schema": {}}])
    assert compile_when({"any": [{"tools": {"gt": 0}}, {"header.x-priority": True}]}, "w").holds(shape) is True
    assert "tool_facts" not in vars(shape)  # the header held: the tools were not read


def test_the_named_headers_are_picked_in_one_pass_as_starlette_would_answer():
    raw = [(b"x-team", b"red"), (b"x-team", b"blue"), (b"x-other", b"o")]
    names = header_names(["x-team", "x-absent"])
    assert picked(Headers(raw=raw), names) == {"x-team": "red", "x-absent": None, "x-claude-code-agent-id": None,
                                               "x-claude-code-session-id": None}  # fmt: skip
    shape = routed(Reader(header_names=names), Headers(raw=raw))
    assert shape.header("x-team") == "red" and shape.header("x-other") == "o"  # not named: asked of the headers
    assert routed(Reader(header_names=names), {"x-team": "green"}).header("x-team") == "green"


def test_a_memo_answers_for_the_same_bytes_only():
    calls: list[bytes] = []

    def derive(part: msgspec.Raw) -> int:
        calls.append(bytes(part))
        return len(calls)

    memo, size = Memo(derive, size=2), SMALLEST + 10
    first, same, other = (msgspec.Raw(b'"' + c * (size - 2) + b'"') for c in (b"a", b"a", b"b"))
    assert memo(first) == 1 and memo(same) == 1  # equal bytes, another object: kept
    assert memo(other) == 2 and memo(first) == 3  # the same length, other bytes: read again, in its place
    small = msgspec.Raw(b"[]")
    assert memo(small) == 4 and memo(small) == 5  # small parts are not kept
    for length in (size + 1, size + 2, size + 3):
        memo(msgspec.Raw(b'"' + b"c" * (length - 2) + b'"'))
    assert len(memo._kept) == 2  # bounded


def test_the_tools_and_the_billing_flag_read_through_a_tables_memo_as_without_one():
    reader = Reader.table((2048, 8192), ())
    schema = {"type": "object", "description": "d" * SMALLEST}
    tools = [{"name": "a", "input_schema": schema}, {"type": "web_search_20250305", "name": "web_search"}]
    flagged = [{"type": "text", "text": BILLING + " cc_is_subagent=true;"}, {"type": "text", "text": "s" * SMALLEST}]
    plain = [{"type": "text", "text": BILLING + " cc_is_subagent=false"}, {"type": "text", "text": "s" * SMALLEST}]
    for _ in range(2):
        shape = routed(reader, tools=tools, system=flagged)
        assert shape.server_tools == ["web_search_20250305"] and shape.tool_count == 2 and shape.subagent
        assert not routed(reader, tools=tools[:1], system=plain).subagent  # one byte apart: read again
    assert flagged_system(msgspec.Raw(json.dumps(flagged).encode())) and not flagged_system(msgspec.Raw(b'"text"'))


def test_the_tool_facts_count_every_object_and_keep_the_server_tools_types():
    tools = [{"type": 5}, {"type": "custom", "name": "c"}, {"type": "web_search_20250305"}, {}, {"type": None}]
    assert tool_facts(msgspec.Raw(json.dumps(tools).encode())) == (5, ["web_search_20250305"])
    for odd in ([1, 2], {"type": "web_search_1"}, "tools", [{"type": "x"}, []]):  # not a list of objects: none
        assert tool_facts(msgspec.Raw(json.dumps(odd).encode())) == (0, [])
