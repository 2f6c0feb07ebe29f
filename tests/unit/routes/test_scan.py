"""A route table's tests written into one function answer as the routes do one by one: the
same first route, the same verdict, for every kind of condition, on every read of the body."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dragoman.protocol.anthropic import ENVELOPE, MESSAGES_REQUEST
from dragoman.routes.conditions import When, compile_when
from dragoman.routes.scan import following, scanner
from dragoman.routes.shape import Shape, routed_envelope

ROUTED = msgspec.json.Decoder(routed_envelope({"metadata"}))
READS = {
    "body": lambda raw: None,
    "envelope": ENVELOPE.decode,
    "routed": ROUTED.decode,
    "whole": MESSAGES_REQUEST.decode,
}
SEARCH = {"type": "web_search_20250305", "name": "web_search"}
TOOL = {"name": "t", "input_schema": {"type": "object"}}
WHENS: list[dict[str, Any]] = [
    {"model": ["claude-haiku-*", "small"]},
    {"header": {"x-team": "red-*"}},
    {"header.x-tag": True},
    {"header.x-tag": False, "model": "other"},
    {"subagent": True},
    {"images": False, "stream": True},
    {"server_tool": "web_search_*"},
    {"tools": {"gt": 1}},
    {"tools": 0, "output_format": "json_schema"},
    {"max_tokens": {"le": 10}, "stream": False},
    {"thinking": {"effort": ["high"]}},
    {"body.metadata.user_id": {"glob": "ci-*"}},
    {"any": [{"tools": {"gt": 5}}, {"header.x-priority": True}]},
    {"input_tokens": {"gt": 10}},
]
REQUESTS: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({}, {"model": "claude-haiku-4-5"}),
    ({"x-team": "red-1"}, {}),
    ({"x-tag": ""}, {"model": "other"}),
    ({}, {"model": "other"}),
    ({"x-claude-code-agent-id": "a"}, {}),
    ({}, {"stream": True}),
    ({}, {"tools": [TOOL, SEARCH]}),
    ({}, {"tools": [TOOL, TOOL]}),
    ({}, {"output_format": {"type": "json_schema", "schema": {}}}),
    ({}, {"max_tokens": 5}),
    ({}, {"thinking": {"type": "enabled", "budget_tokens": 9000}, "output_config": {"effort": "high"}}),
    ({}, {"metadata": {"user_id": "ci-3"}}),
    ({"x-priority": "1"}, {}),
    ({}, {}),
]


def shape(headers: dict[str, str], fields: dict[str, Any], read: str) -> Shape:
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **fields}
    raw = json.dumps(body).encode()
    return Shape(body["model"], headers, raw, READS[read](raw))


def one_by_one(whens: list[When | None], request: Shape) -> tuple[int, bool | None]:
    for at, when in enumerate(whens):
        verdict = None if when is None else when.holds(request)
        if verdict or verdict is None:
            return at, verdict
    return -1, False


@pytest.mark.parametrize("read", sorted(READS))
def test_the_written_table_answers_as_its_routes_one_by_one(read: str) -> None:
    compiled = [compile_when(when, f"routes.{i}.when") for i, when in enumerate(WHENS)]
    seen = set()
    for start in range(len(compiled)):  # each table first, then the others after it
        whens: list[When | None] = compiled[start:] + compiled[:start]
        scan = scanner(whens)
        for headers, fields in REQUESTS:
            found = scan(shape(headers, fields, read))
            assert found == one_by_one(whens, shape(headers, fields, read)), (start, headers, fields)
            seen.add(found[0])
    assert seen >= {0, 1}  # some tables held, some did not


@pytest.mark.parametrize("sticky", range(3))
def test_a_route_only_matches_can_tell_stops_the_scan_and_the_rest_follows(sticky: int) -> None:
    compiled: list[When | None] = [compile_when(when, "w") for when in WHENS[:3]]
    compiled[sticky] = None
    request = shape({"x-tag": "1"}, {}, "routed")  # only the third holds
    assert scanner(compiled)(request) == (sticky, None)  # those before it do not hold
    tests = [(None if when is None else when.holds, when) for when in compiled]
    assert following(tests, request, sticky + 1) == ((2, True) if sticky < 2 else (-1, False))


def test_the_plain_conditions_are_written_out_not_called() -> None:
    plain = [compile_when(when, "w") for when in WHENS[:10]]
    assert all(getattr(test, "inline", None) for when in plain for test in when.tests)
    assert not hasattr(compile_when(WHENS[10], "w").tests[0], "inline")  # thinking: called as it is
