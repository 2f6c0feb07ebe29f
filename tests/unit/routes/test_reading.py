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
    assert "images" not in vars(shape) and "tool_facts" not in vars(shape)  # the model decided: nothing read
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


FACTS = msgspec.json.Decoder(routed_envelope((), facts=True))
ODD_TOOLS: list[Any] = [
    [{"type": 5}, {"type": "custom", "name": "c"}, {"type": "web_search_20250305"}, {}, {"type": None}],
    [{"name": "n", "input_schema": {"type": "object", "properties": {"type": {"type": "web_search_1"}}}}],  # nested
    [{"name": 'q"uote', "type": 'code_execution_\u00e9"x'}, {"type": {"nested": ["web_search_2"]}}],  # escaped
    [1, 2],
    [{"type": "x"}, []],
    [{"type": "x"}, None],
    {"type": "web_search_1"},
    "tools",
    3,
    None,
    True,
    [],
]
ODD_SYSTEMS: list[Any] = [
    [{"type": "text", "text": BILLING + " cc_is_subagent=true;"}, {"type": "text", "text": "s"}],
    [{"type": "text", "text": BILLING + ' cc_is_subagent="true"\n\u00e9'}],  # escaped
    [{"text": BILLING + " cc_is_subagent=true"}, "s"],
    [{"text": 5}],
    [{}],
    [],
    {"text": BILLING},
    BILLING,
    None,
    7,
]


def test_an_envelope_reading_the_facts_in_its_own_pass_finds_what_the_separate_read_does():
    for index, tools in enumerate(ODD_TOOLS):
        system = ODD_SYSTEMS[index % len(ODD_SYSTEMS)]
        raw = json.dumps({"model": "m", "messages": [], "tools": tools, "system": system}).encode()
        apart, shared = (Shape("m", {}, raw, decoder.decode(raw)) for decoder in (ROUTED, FACTS))
        assert shared._facts and not apart._facts  # each read as it was built to
        for fact in ("tool_count", "server_tools", "subagent"):
            assert getattr(shared, fact) == getattr(apart, fact), (fact, tools, system)
        # a count's body, should a route count after all, holds the same parts (read from the body)
        assert json.loads(shared.count_body()) == json.loads(apart.count_body())
    absent = b'{"model": "m", "messages": []}'
    shape = Shape("m", {}, absent, FACTS.decode(absent))
    assert (shape.tool_count, shape.server_tools, shape.subagent) == (0, [], False)


SPLIT = msgspec.json.Decoder(routed_envelope((), split=True))


def test_an_envelope_splitting_the_system_prompt_finds_the_flag_and_counts_the_same_json():
    flagged = [{"type": "text", "text": BILLING + " cc_is_subagent=true;"}, {"type": "text", "text": "s" * SMALLEST}]
    for index, system in enumerate([*ODD_SYSTEMS, flagged, "s\u00e9\n" * 900]):
        tools = ODD_TOOLS[index % len(ODD_TOOLS)]
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                "system": system, "metadata": {"user_id": "u"}}  # fmt: skip
        raw = json.dumps(body, indent=index % 2 or None).encode()  # with spaces, or none
        apart, split = (
            Shape("m", {}, raw, decoder.decode(raw), Reader.table((2048, 8192), ())) for decoder in (ROUTED, SPLIT)
        )
        assert split._split and not apart._split
        assert split.subagent == apart.subagent, system
        assert (split.tool_count, split.server_tools) == (apart.tool_count, apart.server_tools)
        counted = json.loads(split.count_body())  # the same JSON, its system re-encoded from the blocks read
        assert counted == json.loads(apart.count_body()) and counted["system"] == system
        assert split.count_body().count(b'"tools":') == 1 and b'"max_tokens"' not in split.count_body()
    assert Shape("m", {}, raw, SPLIT.decode(raw)).subagent is False
    for absent in (b'{"model": "m", "messages": []}', b'{"model": "m", "messages": [], "system": null}'):
        apart, split = (Shape("m", {}, absent, decoder.decode(absent)) for decoder in (ROUTED, SPLIT))
        assert split.count_body() == apart.count_body()  # left out when absent, `null` when sent so
        assert split.subagent is False


def test_only_a_table_that_asks_the_tools_and_needs_no_bytes_of_them_reads_them_with_its_envelope():
    from dragoman.core.config_load import from_dict
    from dragoman.routes.table import Routes

    def read(when: dict[str, Any], **upstream: Any) -> Any:
        models = [{"name": "b", "upstream": "u"}]
        routes = [{"name": "r", "when": when, "model": "b"}]
        config = from_dict({"upstreams": {"u": {"url": "http://127.0.0.1:1/v1", **upstream}}, "models": models,
                            "routes": routes})  # fmt: skip
        return Routes(config, None).envelope.decode(b'{"model": "m"}')  # type: ignore[arg-type]

    def facts(when: dict[str, Any], **upstream: Any) -> bool:
        return bool(getattr(read(when, **upstream), "facts", False))

    assert facts({"server_tool": "web_search_*"}) and facts({"any": [{"tools": 0}, {"subagent": True}]})
    assert not facts({"model": "claude-*"})  # nothing asked of them: kept as sent
    assert not facts({"tools": 0, "any": [{"input_tokens": {"gt": 5}}]})  # a count's body splices their bytes
    assert not facts({"tools": 0}, replicas=["http://127.0.0.1:2/v1"])  # cache-aware placement hashes them
    assert facts({"tools": 0}, replicas=["http://127.0.0.1:2/v1"], routing="least_loaded")
    # a counting table reads a system prompt it asks of in one pass, split; the tools as sent (a memo's)
    assert read({"subagent": True, "any": [{"input_tokens": {"gt": 5}}]}).split is True
    assert read({"tools": 0, "any": [{"fits": True}]}).split is False
    assert read({"subagent": True, "any": [{"fits": True}]}, replicas=["http://127.0.0.1:2/v1"]).split is False


def test_a_passed_through_count_hands_the_backend_the_envelope_whose_messages_it_holds():
    import asyncio

    from dragoman.backends.images import may_have_url_images
    from dragoman.calls.types import Call, Completed, Outcome, Route
    from dragoman.core.capabilities import ModelCaps
    from dragoman.core.config_load import from_dict
    from dragoman.routes.table import Routes

    calls: list[Call] = []

    class Passing:
        name, path = "p", "passthrough"

        async def count_tokens(self, call: Call, route: Any) -> Completed:
            calls.append(call)
            return Completed(b'{"input_tokens": 9}')

    async def resolve(name: str) -> Route:
        return Route(Passing(), "u", name, ModelCaps(), 100_000)  # type: ignore[arg-type]

    models = [{"name": "m", "upstream": "u"}]
    config = from_dict({"upstreams": {"u": {"url": "http://127.0.0.1:1/v1"}}, "models": models,
                        "routes": [{"name": "r", "when": {"input_tokens": {"gt": 5}}, "model": "m"}]})  # fmt: skip
    routes = Routes(config, resolve)
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    raw = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [image]}]}).encode()
    for endpoint in ("messages", "count_tokens"):
        envelope = routes.envelope.decode(raw)
        asyncio.run(routes.route(raw, {}, envelope, endpoint, Outcome(request_id="r", endpoint=endpoint)))
        call = calls.pop()
        assert call.envelope is envelope
        assert (call.body == raw) is (endpoint == "count_tokens")  # a message's count: spliced without max_tokens
        assert may_have_url_images(call.body, call.envelope) and may_have_url_images(call.body)
