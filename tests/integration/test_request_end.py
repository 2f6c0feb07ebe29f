"""Every request ends once (`Outcome.finish`), through the official SDK: whatever way it
ends (an answer, an error before or from the upstream, a stream cut by the upstream or left
by its client, a count, a batch's request), its upstream slot is freed exactly once and its
outcome recorded exactly once. The slot is the upstream's only one (`max_concurrent = 1`,
no queue): one never freed turns the next request away, one freed twice lets two in."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from dragoman.calls.types import Outcome
from tests.support.batches import wait_ended
from tests.support.fakes import FakeUpstream, Reply, chunk, completion, text_stream
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

VALID = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


class Ends:
    """The gateway's recorded outcomes (a metrics sink sees each recording)."""

    def __init__(self, server: GatewayServer) -> None:
        self.outcomes: list[Outcome] = []
        server.app.state.gateway.metrics.sinks.append(lambda outcome, duration: self.outcomes.append(outcome))

    def of(self, endpoint: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.endpoint == endpoint]

    def each_once(self) -> bool:
        return all(n == 1 for n in collections.Counter(o.request_id for o in self.outcomes).values())


@pytest.fixture
def one_slot(make_gateway) -> Iterator[tuple[GatewayServer, Ends]]:
    server = make_gateway(upstream={"max_concurrent": 1, "max_queue": 0, "max_retries": 0})
    yield server, Ends(server)


def assert_one_slot_free(server: GatewayServer, upstream: FakeUpstream, ends: Ends) -> None:
    """The upstream's one slot is free, and there is only one: a request holding it turns
    a second away (529), and once it is answered the next gets in."""
    before = len(ends.outcomes)
    release = threading.Event()
    upstream.queue(Reply(body=completion("held"), hold=release))
    sent = len(upstream.requests)
    held = threading.Thread(target=lambda: httpx.post(server.url + "/v1/messages", json=VALID, timeout=10))
    held.start()
    eventually(
        lambda: len(upstream.requests) > sent, "the held request at the upstream"
    )  # it holds the slot, at the upstream
    turned_away = httpx.post(server.url + "/v1/messages", json=VALID, timeout=10)
    release.set()
    held.join()
    assert turned_away.status_code == 529  # not freed twice before
    assert httpx.post(server.url + "/v1/messages", json=VALID, timeout=10).status_code == 200  # freed
    eventually(lambda: len(ends.outcomes) == before + 3, "the requests recorded")
    assert ends.each_once()


def sdk(server: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=10)


def test_an_answer_and_a_finished_stream_end_once(one_slot, upstream):
    server, ends = one_slot
    assert sdk(server).messages.create(**VALID).content[0].text == "Hello!"
    upstream.stream_reply(text_stream("a", "b"))
    with sdk(server).messages.stream(**VALID) as stream:
        assert stream.get_final_text() == "ab"
    eventually(lambda: len(ends.outcomes) == 2, "the requests recorded")
    assert [o.status for o in ends.outcomes] == [200, 200]
    assert_one_slot_free(server, upstream, ends)


def test_errors_before_and_from_the_upstream_end_once(one_slot, upstream):
    server, ends = one_slot
    with pytest.raises(anthropic.BadRequestError):  # refused before any slot is taken
        sdk(server).messages.create(model="test-model", max_tokens=-1, messages=VALID["messages"])
    upstream.json_reply({"error": {"message": "bad things"}}, status=500)
    with pytest.raises(anthropic.InternalServerError):  # the upstream's failure, with the slot held
        sdk(server).messages.create(**VALID)
    eventually(lambda: len(ends.outcomes) == 2, "the requests recorded")
    assert [(o.status, o.error_type) for o in ends.outcomes] == [(400, "invalid_request_error"), (502, "api_error")]
    assert_one_slot_free(server, upstream, ends)


def test_a_stream_the_upstream_cuts_short_ends_once(one_slot, upstream):
    server, ends = one_slot
    upstream.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "a"})], done=False)
    with pytest.raises(anthropic.APIStatusError), sdk(server).messages.stream(**VALID) as stream:
        stream.get_final_text()  # the stream's `error` event
    eventually(lambda: len(ends.outcomes) == 1, "the requests recorded")
    assert ends.outcomes[0].status == 200 and ends.outcomes[0].error_type == "api_error"
    assert_one_slot_free(server, upstream, ends)


def test_a_client_leaving_mid_stream_ends_once(one_slot, upstream):
    server, ends = one_slot
    upstream.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "a"}), ("sleep", 5),
                           chunk({}, "stop")])  # fmt: skip
    with sdk(server).messages.stream(**VALID) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break  # and the block's end closes the stream: the client leaves
    eventually(lambda: len(ends.outcomes) == 1, "the requests recorded")
    assert ends.outcomes[0].disconnected
    assert_one_slot_free(server, upstream, ends)


def test_a_count_ends_once(one_slot, upstream):
    server, ends = one_slot
    assert sdk(server).messages.count_tokens(model="test-model", messages=VALID["messages"]).input_tokens > 0
    eventually(lambda: len(ends.of("count_tokens")) == 1, "the requests recorded")
    assert ends.of("count_tokens")[0].status == 200
    assert_one_slot_free(server, upstream, ends)


def test_each_request_of_a_batch_ends_once(one_slot, upstream):
    server, ends = one_slot
    upstream.queue(Reply(body=completion("one")), Reply(status=500, body={"error": {"message": "boom"}}))
    client = sdk(server)
    batch = client.messages.batches.create(
        requests=[{"custom_id": "ok", "params": VALID}, {"custom_id": "bad", "params": VALID}]
    )
    ended = wait_ended(client, batch.id)
    assert (ended.request_counts.succeeded, ended.request_counts.errored) == (1, 1)
    eventually(lambda: len(ends.of("batch")) == 2, "the requests recorded")
    assert sorted(o.status for o in ends.of("batch")) == [200, 502]
    assert_one_slot_free(server, upstream, ends)
