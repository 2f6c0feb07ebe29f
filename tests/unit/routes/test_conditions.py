"""Conditions over a request's shape, one by one, without a server: what each key reads, the
same whether the core decoded the body whole, read its envelope, or nothing of it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dragoman.protocol.anthropic import ENVELOPE, MESSAGES_REQUEST
from dragoman.routes.conditions import compile_when
from dragoman.routes.shape import Shape, routed_envelope

ROUTED = msgspec.json.Decoder(routed_envelope({"metadata", "temperature", "service_tier"}))
READ = {"body": lambda body: None, "envelope": ENVELOPE.decode, "routed": ROUTED.decode,
        "whole": MESSAGES_REQUEST.decode}  # fmt: skip
mode = "body"


@pytest.fixture(autouse=True, params=sorted(READ))
def read_as(request: pytest.FixtureRequest) -> Any:
    global mode
    mode = request.param
    yield
    mode = "body"


def shape(headers: dict[str, str] | None = None, model: str = "claude-opus-5-5", **body: Any) -> Shape:
    request = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **body}
    raw = json.dumps(request).encode()
    return Shape(model, headers or {}, raw, read=READ[mode](raw))


def holds(when: dict[str, Any], request: Shape) -> bool | None:
    return compile_when(when, "when").holds(request)


def test_the_session_comes_from_the_header_then_metadata_in_either_form():
    assert shape({"x-claude-code-session-id": "h"}, metadata={"user_id": "u_x_session_abc"}).session == "h"
    assert shape(metadata={"user_id": "user_1_account_2_session_abc"}).session == "abc"
    assert shape(metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s-9"})}).session == "s-9"
    assert shape(metadata={"user_id": "plain"}).session == "plain"
    assert shape().session is None


def test_effort_is_output_configs_else_the_budgets():
    assert shape(thinking={"type": "adaptive"}, output_config={"effort": "max"}).effort == "max"
    assert shape(thinking={"type": "enabled", "budget_tokens": 1024}).effort == "low"
    assert shape(thinking={"type": "enabled", "budget_tokens": 8192}).effort == "medium"
    assert shape(thinking={"type": "enabled", "budget_tokens": 8193}).effort == "high"
    assert shape(thinking={"type": "adaptive"}).effort is None
    when = {"thinking": {"effort": ["low"], "budget": {"lt": 2000}}}
    assert holds(when, shape(thinking={"type": "enabled", "budget_tokens": 1500})) is True
    assert holds(when, shape(thinking={"type": "disabled", "budget_tokens": 1500})) is False


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ({"body.metadata.tags.1": "b"}, True),
        ({"body.metadata.tags.5": {"exists": False}}, True),
        ({"body.metadata.tags": {"exists": True}}, True),
        ({"body.metadata.level": {"in": [1, 2, 3]}}, True),
        ({"body.metadata.level": {"ge": 2, "lt": 3}}, True),
        ({"body.metadata.level": {"gt": 2}}, False),
        ({"body.metadata.flag": True}, True),
        ({"body.metadata.flag": 1}, False),  # true is not 1
        ({"body.temperature": {"exists": True}}, False),
    ],
)
def test_body_paths(when, expected):
    assert holds(when, shape(metadata={"tags": ["a", "b"], "level": 2, "flag": True})) is expected


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ({"body.metadata.user_id": {"glob": "ci-*"}}, True),
        ({"body.metadata.team": "red"}, True),  # a key the decoded request's Metadata drops
        ({"body.metadata": {"eq": {"user_id": "ci-7", "team": "red"}}}, True),  # the whole table, as sent
        ({"body.service_tier": "auto"}, True),  # a field no decoded struct declares
        ({"body.temperature": {"exists": True}}, False),  # null counts as absent
        ({"body.stream": {"exists": True}}, False),  # absent, though the decoded request says false
        ({"body.stop_sequences.0": "END"}, True),
        ({"body.messages.0.role": "user"}, True),
        ({"body.messages.0.content": "hi"}, True),
    ],
)
def test_body_paths_read_what_was_sent_not_what_was_decoded(when, expected):
    request = shape(metadata={"user_id": "ci-7", "team": "red"}, service_tier="auto", temperature=None,
                    stop_sequences=["END"])  # fmt: skip
    assert holds(when, request) is expected


def test_a_routed_envelope_keeps_the_fields_routes_read_and_the_rest_as_before():
    read = ROUTED.decode(b'{"model": "m", "max_tokens": 5, "messages": [], "metadata": {"user_id": "u"}}')
    assert isinstance(read, ENVELOPE.type) and read.max_tokens == 5
    assert Shape("m", {}, b"not read", read=read).body_at(("metadata", "user_id")) == "u"  # not from the body


def test_output_format_from_output_config_or_the_older_field():
    schema = {"type": "json_schema", "schema": {}}
    assert holds({"output_format": "json_*"}, shape(output_config={"format": schema})) is True
    assert holds({"output_format": "json_schema"}, shape(output_format=schema)) is True
    assert holds({"output_format": "json_schema"}, shape()) is False


def test_counted_conditions_wait_for_the_count_and_run_last():
    when = {"tools": 0, "input_tokens": {"gt": 10}}
    request = shape()
    assert holds(when, request) is None  # needs the count
    request.tokens = 11
    assert holds(when, request) is True
    with_tools = shape(tools=[{"name": "t", "input_schema": {}}])
    assert holds(when, with_tools) is False  # decided without a count
    any_of = {"any": [{"stream": True}, {"input_tokens": {"gt": 10}}]}
    assert holds(any_of, shape()) is None and holds(any_of, shape(stream=True)) is True


@pytest.mark.parametrize(("comparison", "below", "at", "above"), [
    ({"gt": 500}, False, False, True), ({"ge": 500}, False, True, True), ({"lt": 500}, True, False, False),
    ({"le": 500}, True, True, False), ({"eq": 500}, False, True, False), ({"gt": 499, "lt": 501}, False, True, False)])  # fmt: skip
def test_a_count_alone_waits_for_it_then_decides_at_its_bound(comparison: dict[str, int], below: bool, at: bool,
                                                              above: bool) -> None:  # fmt: skip
    when = compile_when({"input_tokens": comparison}, "when")  # its own short test: asked before and after the count
    request = shape()
    assert when.holds(request) is None
    for tokens, verdict in ((499, below), (500, at), (501, above)):
        request.tokens = tokens
        assert when.holds(request) is verdict, (comparison, tokens)
    fits = compile_when({"fits": True}, "when")
    request.tokens, request.window = 400, 500  # with max_tokens 100: exactly the window
    assert fits.holds(shape()) is None and fits.holds(request) is True
    request.tokens = 401
    assert fits.holds(request) is False


def test_fits_uses_the_window_of_the_name_s_own_model():
    request = shape(max_tokens=900)
    request.tokens, request.window = 100, 1000
    assert holds({"fits": True}, request) is True
    request.window = 999
    assert holds({"fits": False}, request) is True
    request.window = None
    assert holds({"fits": True}, request) is True  # unknown: it fits


def test_the_subagent_flag_is_only_read_from_the_billing_block():
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.a7e; cc_is_subagent=true;"}
    other = {"type": "text", "text": "notes: cc_is_subagent=true"}
    assert shape(system=[billing]).subagent is True
    assert shape(system=[other, billing]).subagent is False
    assert shape({"x-claude-code-agent-id": "a1"}).subagent is True
    assert shape(system="cc_is_subagent=true").subagent is False


def test_a_count_body_holds_the_counted_fields_as_sent_and_nothing_else():
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    request = shape(system=[{"type": "text", "text": "s"}], tools=tools, tool_choice={"type": "auto"}, stream=True,
                    thinking={"type": "adaptive"}, metadata={"user_id": "u"})  # fmt: skip
    counted = json.loads(request.count_body())
    assert counted == {"model": "claude-opus-5-5", "messages": [{"role": "user", "content": "hi"}],
                       "system": [{"type": "text", "text": "s"}], "tools": tools, "tool_choice": {"type": "auto"},
                       "thinking": {"type": "adaptive"}}  # fmt: skip


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                          {"role": "user", "content": [{"type": "text", "text": "c"}]}]])  # fmt: skip
def test_a_count_body_splices_any_number_of_messages(messages: list[dict[str, Any]]) -> None:
    counted = json.loads(shape(messages=messages, output_config={"effort": "low"}).count_body())
    assert counted == {"model": "claude-opus-5-5", "messages": messages, "output_config": {"effort": "low"}}
