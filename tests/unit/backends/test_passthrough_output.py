"""A passthrough stream cut before `message_delta` told its output tokens: they are estimated
from what was relayed (about four bytes of text a token, at least one a delta), at most
`max_tokens`, and a count the upstream did report is kept."""

from __future__ import annotations

import json

import pytest

from dragoman.backends.anthropic import output
from dragoman.backends.anthropic.events import Events
from dragoman.backends.anthropic.output import relayed_tokens
from dragoman.calls.types import Call, Outcome
from dragoman.core.redaction import NO_KEYS
from tests.support.passthrough_stream import BLOCK, END, START, STOP, delta, relay, relay_cut


@pytest.mark.parametrize(
    ("events", "tokens"),
    [
        (delta("Hello, world"), 3),  # 12 bytes
        (delta("Hi"), 1),  # at least one a delta
        (delta(""), 1),
        (delta("Hi") * 3, 3),  # each delta holds whole tokens
        (delta("let me think it over", "thinking"), 5),
        (delta('{"city": "Par', "partial_json"), 4),  # 16 bytes as JSON has it: {\"city\": \"Par
        (START + BLOCK + STOP, 0),  # no delta
        (BLOCK, 0),  # a block's empty text is no delta
    ],
)
def test_the_tokens_of_relayed_events(events: bytes, tokens: int) -> None:
    assert relayed_tokens(events) == tokens


def test_a_delta_as_a_server_spacing_its_json_sends_it_is_counted_the_same() -> None:
    data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello, world"}}
    assert relayed_tokens(b"event: content_block_delta\ndata: " + json.dumps(data).encode() + b"\n\n") == 3


def test_a_texts_words_about_text_are_not_counted_twice() -> None:
    sly = delta('he said "text": "no" then')  # its quotes are escaped: no second text
    assert relayed_tokens(sly) == relayed_tokens(delta("x" * len(json.dumps('he said "text": "no" then')[1:-1])))


def test_a_stream_the_client_cut_counts_what_it_relayed() -> None:
    reads = [START, BLOCK, delta("Hello, world"), delta("Hello, world"), delta("and more"), STOP, END]
    got, outcome = relay_cut(reads, chunks=4)  # message_start with the block, two deltas
    assert got.count(b"content_block_delta") == 2 * 2 and b"and more" not in got
    assert outcome.output_tokens == 6  # not message_start's 1, nor max_tokens


def test_a_count_the_upstream_reported_is_kept_when_the_client_leaves_after_it() -> None:
    reads = [START, BLOCK, delta("Hi" * 400), STOP + END]
    _, outcome = relay_cut(reads, chunks=4)  # the client leaves once message_delta went past
    assert outcome.output_tokens == 12  # message_delta's, not the estimate (200)


def test_an_estimate_is_at_most_max_tokens() -> None:
    reads = [START, BLOCK, delta("word " * 100), delta("more"), STOP, END]
    _, outcome = relay_cut(reads, chunks=3, body=b'{"model": "m", "max_tokens": 20, "messages": []}')
    assert outcome.output_tokens == 20  # 125 estimated; the upstream generates no more than 20


def test_a_stream_cut_before_any_delta_keeps_message_starts_count() -> None:
    _, outcome = relay_cut([START, BLOCK, 5.0, delta("late")], chunks=1)
    assert outcome.output_tokens == 1


def test_a_stream_ended_by_an_error_event_counts_what_it_relayed() -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
    _, outcome, _ = relay([START, BLOCK, delta("Hello, world"), delta("Hello, world"), error])
    assert outcome.output_tokens == 6 and outcome.error_type == "overloaded_error"


def test_a_complete_stream_has_the_upstreams_count() -> None:
    _, outcome, _ = relay([START, BLOCK, delta("Hello, world" * 50), STOP, END])
    assert outcome.output_tokens == 12


def _cut(reads: list[bytes]) -> int:
    outcome = Outcome(request_id="req_1", endpoint="messages")
    events = Events(Call(b"{}", "m", "m", {}, "req_1", True, outcome), "native", NO_KEYS)
    for read in reads:
        events.take(read)
    events.count_output()
    assert outcome.output_tokens is not None
    return outcome.output_tokens


@pytest.mark.parametrize("burst", [1, 7, 64])
def test_a_long_stream_measured_in_samples_is_counted_near_its_whole(burst: int) -> None:
    deltas = [delta("abcdefgh" if i % 3 else "abcdefghijklmnop") for i in range(3000)]  # 2 or 4 tokens each
    reads = [START, BLOCK] + [b"".join(deltas[i : i + burst]) for i in range(0, len(deltas), burst)]
    assert sum(relayed_tokens(d) for d in deltas) == 8000
    assert 8000 * 0.95 <= _cut(reads) <= 8000 * 1.05


def test_a_short_stream_is_measured_whole() -> None:
    deltas = [delta("x" * n) for n in (1, 30, 4, 60, 9)]
    reads = [START, BLOCK, *deltas]
    assert sum(len(r) for r in reads) < output.MEASURED_BYTES + len(deltas[-1])
    assert _cut(reads) == 1 + 8 + 1 + 15 + 3
