"""Message Batches over a real socket with the official SDK: expiry and retention, the
`batches.max_concurrent` bound (cancel and expiry never wait for another batch's slots),
the gateway's API keys, and a batch through a passthrough upstream."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.batches import (
    KEY,
    answer_per_marker,
    counts,
    marker_of,
    params,
    results_of,
    sdk,
    wait_ended,
)
from tests.support.envelopes import error_of, raw_error
from tests.support.fake_anthropic import NativeReply, message
from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.waiting import eventually


def test_requests_not_started_before_expiry_end_as_expired(start, upstream):
    expired = threading.Event()
    answer_per_marker(upstream, hold=expired)  # the first request is in flight until the batch has expired
    client = sdk(
        start(batches={"max_concurrent": 1, "expire_after": 2.0})
    )  # room for the first to start on a loaded machine
    created = client.messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(3)]
    )
    expires_by = time.time() + 2.0
    assert abs((created.expires_at - created.created_at).total_seconds() - 2.0) < 0.01
    eventually(lambda: len(upstream.requests) == 1)
    time.sleep(max(0.0, expires_by - time.time()))  # not a guess: the expiry is the event this test is about
    expired.set()

    ended = wait_ended(client, created.id)
    assert counts(ended) == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 0, "expired": 2}
    results = results_of(client, created.id)
    assert len(upstream.requests) == 1
    started = f"r{marker_of(upstream.requests[0])[1:]}"
    assert results[started].type == "succeeded"
    assert sorted(cid for cid, r in results.items() if r.type == "expired") == sorted(set(results) - {started})


def test_a_batch_past_its_expiry_before_it_starts_is_all_expired(start, upstream):
    client = sdk(start(batches={"expire_after": 1e-6}))
    created = client.messages.batches.create(requests=[{"custom_id": f"r{i}", "params": params()} for i in range(3)])
    ended = wait_ended(client, created.id)
    assert counts(ended) == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 3}
    assert {r.type for r in results_of(client, created.id).values()} == {"expired"}
    assert upstream.requests == []


def test_ended_batches_are_forgotten_after_retain_for(start, upstream):
    client = sdk(start(batches={"retain_for": 2.0}))  # long enough to list it after the end on a loaded machine
    created = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    ended = wait_ended(client, created.id)
    assert [b.id for b in client.messages.batches.list().data] == [created.id]  # still kept just after the end
    time.sleep(max(0.0, ended.ended_at.timestamp() + 2.0 - time.time()) + 0.01)  # not a guess: retain_for is the event
    assert client.messages.batches.list().data == []  # listing forgets it
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(created.id)


class CountingUpstream(FakeUpstream):
    """Counts the chat requests it is answering at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0

    async def _chat(self, request):  # type: ignore[override]
        self.in_flight += 1  # one event loop: no lock needed
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super()._chat(request)
        finally:
            self.in_flight -= 1


@pytest.fixture
def counting() -> Iterator[CountingUpstream]:
    fake = CountingUpstream().start()
    yield fake
    fake.stop()


def test_at_most_max_concurrent_batch_requests_in_flight_across_batches(start, counting):
    answer_per_marker(counting, hang=0.15)
    client = sdk(start(batches={"max_concurrent": 2}, upstreams={"default": {"url": counting.url, "max_retries": 0}}))
    first = client.messages.batches.create(
        requests=[{"custom_id": f"a{i}", "params": params(f"a{i}")} for i in range(3)]
    )
    second = client.messages.batches.create(
        requests=[{"custom_id": f"b{i}", "params": params(f"b{i}")} for i in range(3)]
    )

    assert counts(wait_ended(client, first.id))["succeeded"] == 3
    assert counts(wait_ended(client, second.id))["succeeded"] == 3
    assert len(counting.requests) == 6
    assert counting.peak == 2  # the bound is reached, and never passed, across both batches


def test_interactive_requests_are_not_held_behind_batch_slots(start, upstream):
    answered = threading.Event()

    def respond(body: dict) -> Reply:
        marker = marker_of(body)
        return Reply(body=completion(f"answer to {marker}"), hold=answered if marker.startswith("batch") else None)

    upstream.responder = respond
    client = sdk(start(batches={"max_concurrent": 1}))
    created = client.messages.batches.create(requests=[{"custom_id": "b0", "params": params("batch0")}])
    eventually(
        lambda: len(upstream.requests) == 1
    )  # the only batch slot is taken, until the interactive request is answered

    reply = client.messages.create(
        **params("interactive")
    )  # held behind the slot, it would never be answered (the SDK gives up)
    assert reply.content[0].text == "answer to interactive"
    assert client.messages.batches.retrieve(created.id).processing_status == "in_progress"
    answered.set()
    assert counts(wait_ended(client, created.id))["succeeded"] == 1


def test_api_keys_apply_to_every_batch_route(start, upstream):
    answer_per_marker(upstream, hang=0.3)
    gateway = start(server={"api_keys": ["sk-batch"]})
    good = sdk(gateway, "sk-batch")
    wrong = sdk(gateway, "sk-wrong")
    created = good.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])

    for call in (
        lambda: wrong.messages.batches.create(requests=[{"custom_id": "b", "params": params()}]),
        wrong.messages.batches.list,
        lambda: wrong.messages.batches.retrieve(created.id),
        lambda: wrong.messages.batches.cancel(created.id),
        lambda: wrong.messages.batches.delete(created.id),
        lambda: wrong.messages.batches.results(created.id),
    ):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            call()
        error_of(caught, 401, "authentication_error")

    base = f"{gateway.url}/v1/messages/batches"
    for method, url in (
        ("POST", base), ("GET", base), ("GET", f"{base}/{created.id}"), ("POST", f"{base}/{created.id}/cancel"),
        ("DELETE", f"{base}/{created.id}"), ("GET", f"{base}/{created.id}/results"),
        ("GET", f"{base}/msgbatch_01unknown"),  # 401 before 404: no probing for ids
    ):  # fmt: skip
        kwargs: dict[str, Any] = (
            {"json": {"requests": [{"custom_id": "b", "params": params()}]}} if method == "POST" else {}
        )
        raw_error(httpx.request(method, url, timeout=5, **kwargs), 401, "authentication_error")

    ended = wait_ended(good, created.id)
    assert ended.cancel_initiated_at is None  # the refused cancel did nothing
    assert counts(ended)["succeeded"] == 1
    raw = httpx.get(ended.results_url, headers={"x-api-key": "sk-wrong"}, timeout=5)
    raw_error(raw, 401, "authentication_error")
    assert next(iter(good.messages.batches.results(created.id))).result.type == "succeeded"
    assert [b.id for b in good.messages.batches.list().data] == [created.id]  # the refused create made nothing
    assert len(upstream.requests) == 1


# -- what one key may keep -------------------------------------------------------------------


def test_a_key_is_bounded_in_stored_bytes_and_batches_and_no_other_key_is(start, upstream):
    answer_per_marker(upstream)
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]}, batches={"max_stored_bytes": 6000, "max_batches": 2})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    big = [{"custom_id": f"r{i}", "params": params("x" * 400)} for i in range(5)]  # over 2000 bytes of body
    first = a.messages.batches.create(requests=big)
    wait_ended(a, first.id)
    with pytest.raises(anthropic.BadRequestError) as over_bytes:
        a.messages.batches.create(requests=big)
    assert "batches.max_stored_bytes" in over_bytes.value.message and "sk-a" not in over_bytes.value.message
    small = [{"custom_id": "s", "params": params()}]
    a.messages.batches.create(requests=small)
    with pytest.raises(anthropic.BadRequestError) as over_count:
        a.messages.batches.create(requests=small)
    assert "batches.max_batches" in over_count.value.message
    b.messages.batches.create(requests=big)  # another key has its own room
    a.messages.batches.delete(first.id)  # a delete frees the key's room at once
    a.messages.batches.create(requests=small)


def test_listing_and_creating_read_only_the_callers_batches(start, upstream, monkeypatch):
    """What a list or a create looks at is the caller's batches, however many another key has."""
    from dragoman.batches.store import BatchDir, BatchStore

    answer_per_marker(upstream)
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    theirs = {a.messages.batches.create(requests=[{"custom_id": "r", "params": params()}]).id for _ in range(3)}
    mine = b.messages.batches.create(requests=[{"custom_id": "r", "params": params()}])
    looked_at: list[str] = []
    real_batches = BatchStore.batches

    def batches(self: BatchStore, owner: str | None = None) -> list[BatchDir]:
        found = real_batches(self, owner)
        if owner is not None:  # not the keeper's sweep, which looks at every batch
            looked_at.extend(where.id for where in found)
        return found

    monkeypatch.setattr(BatchStore, "batches", batches)
    assert [batch.id for batch in b.messages.batches.list().data] == [mine.id]
    b.messages.batches.create(requests=[{"custom_id": "r", "params": params()}])
    assert mine.id in looked_at and not theirs.intersection(looked_at)


# -- passthrough -------------------------------------------------------------------------------


def test_batch_through_a_passthrough_upstream_keeps_its_error_envelopes(start, native):
    upstream_error = {"type": "error", "error": {"type": "invalid_request_error", "message": "native says no"}}
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "native is busy"}}
    native.replies.extend([
        NativeReply(body=message("native hi", input_tokens=9, output_tokens=3)),
        NativeReply(status=400, body=upstream_error),
        NativeReply(status=529, body=overloaded),
        NativeReply(status=502, events=[b"<html>bad gateway</html>"], headers={"content-type": "text/html"}),
    ])  # fmt: skip
    gateway = start(
        batches={"max_concurrent": 1},  # in order, so each request meets its scripted reply
        upstreams={"native": {"url": native.url + "/v1", "protocol": "anthropic", "api_key": "upstream-secret", "max_retries": 0}},
        models=[{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}],
    )  # fmt: skip
    client = sdk(gateway)
    ids = ["ok", "refused", "overloaded", "html"]
    created = client.messages.batches.create(
        requests=[{"custom_id": cid, "params": params(cid, model="claude-test", temperature=0.5)} for cid in ids],
        extra_headers={"anthropic-beta": "batch-test-beta"},
    )

    ended = wait_ended(client, created.id)
    assert counts(ended) == {"processing": 0, "succeeded": 1, "errored": 3, "canceled": 0, "expired": 0}
    results = results_of(client, created.id)
    assert results["ok"].type == "succeeded"
    assert results["ok"].message.content[0].text == "native hi"
    assert results["ok"].message.model == "claude-test"  # renamed back
    assert (results["ok"].message.usage.input_tokens, results["ok"].message.usage.output_tokens) == (9, 3)
    assert results["refused"].type == "errored"
    assert results["refused"].error.model_dump(exclude_none=True) == upstream_error  # the upstream's envelope, as sent
    assert results["overloaded"].error.model_dump(exclude_none=True) == overloaded
    assert results["html"].type == "errored" and results["html"].error.error.type == "api_error"

    assert len(native.requests) == 4
    for (path, body, headers), cid in zip(native.requests, ids, strict=True):
        assert path == "/v1/messages"
        assert body["model"] == "native-model" and body["temperature"] == 0.5 and body["max_tokens"] == 16
        assert marker_of(body) == cid
        assert "stream" not in body or body["stream"] is False
        assert headers["x-api-key"] == "upstream-secret"  # the client's key is replaced
        assert headers["anthropic-version"] == client.default_headers["anthropic-version"]  # the client's, forwarded
        assert headers["anthropic-beta"] == "batch-test-beta"  # the create request's beta header is forwarded


def test_pretty_printed_upstream_replies_are_one_result_line_each(start, native):
    """A server that indents its JSON (a reply, an error envelope, 400 as text) still makes one
    line per result; the SDK reads every result."""
    refusal = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    pretty = {"content-type": "application/json"}
    native.replies.extend([
        NativeReply(body=json.dumps(message("native hi"), indent=2).encode(), headers=pretty),
        NativeReply(status=400, body=json.dumps(refusal, indent=2).encode(), headers=pretty),
        NativeReply(body=b"{\n  not json", headers=pretty),
    ])  # fmt: skip
    gateway = start(
        batches={"max_concurrent": 1},
        upstreams={"native": {"url": native.url + "/v1", "protocol": "anthropic", "max_retries": 0}},
        models=[{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}],
    )  # fmt: skip
    client = sdk(gateway)
    ids = ["pretty", "refused", "broken"]
    created = client.messages.batches.create(
        requests=[{"custom_id": cid, "params": params(cid, model="claude-test")} for cid in ids]
    )
    wait_ended(client, created.id)
    raw = httpx.get(f"{gateway.url}/v1/messages/batches/{created.id}/results", headers={"x-api-key": KEY}).content
    lines = raw.splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in lines) == sorted(ids)
    results = results_of(client, created.id)
    assert results["pretty"].message.content[0].text == "native hi"
    assert results["refused"].error.model_dump(exclude_none=True) == refusal
    assert results["broken"].type == "errored"


def test_a_beta_header_sent_several_times_reaches_each_request_whole(start, native):
    gateway = start(
        upstreams={"native": {"url": native.url + "/v1", "protocol": "anthropic", "api_key": "upstream-secret", "max_retries": 0}},
        models=[{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}],
    )  # fmt: skip
    body = {"requests": [{"custom_id": "only", "params": params("only", model="claude-test")}]}
    headers = [("x-api-key", KEY), ("anthropic-version", "2023-06-01"), ("anthropic-beta", "first-beta"),
               ("anthropic-beta", "second-beta")]  # fmt: skip
    created = httpx.post(f"{gateway.url}/v1/messages/batches", json=body, headers=headers, timeout=5)
    assert created.status_code == 200, created.text

    wait_ended(sdk(gateway), created.json()["id"])
    ((_, _, sent),) = native.requests
    assert sent["anthropic-beta"] == "first-beta,second-beta"  # as POST /v1/messages forwards them


def _behind_a_busy_batch(
    start, upstream, release: threading.Event, **batches: Any
) -> tuple[anthropic.Anthropic, Any, Any]:
    """With one batch slot, held by batch A's request until `release` is set: A, and batch B,
    none of its requests started."""
    answer_per_marker(upstream, hold=release)
    client = sdk(start(batches={"max_concurrent": 1, **batches}))
    busy = client.messages.batches.create(
        requests=[{"custom_id": f"a{i}", "params": params(f"a{i}")} for i in range(2)]
    )
    eventually(lambda: len(upstream.requests) == 1)
    waiting = client.messages.batches.create(
        requests=[{"custom_id": f"b{i}", "params": params(f"b{i}")} for i in range(2)]
    )
    return client, busy, waiting


def test_a_canceled_batch_with_nothing_running_ends_without_waiting_for_other_batches(start, upstream):
    release = threading.Event()
    client, busy, waiting = _behind_a_busy_batch(start, upstream, release)
    client.messages.batches.cancel(waiting.id)
    ended = wait_ended(client, waiting.id)  # waiting for A's slot, it would not end before A's request is released
    assert client.messages.batches.retrieve(busy.id).processing_status == "in_progress"  # A still holds the slot
    assert counts(ended) == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 2, "expired": 0}
    assert not any(marker_of(body).startswith("b") for body in upstream.requests)
    release.set()


def test_a_batch_past_expiry_with_nothing_running_ends_without_waiting_for_other_batches(start, upstream):
    release = threading.Event()
    client, busy, waiting = _behind_a_busy_batch(
        start, upstream, release, expire_after=2.0
    )  # room for A's request to start first
    ended = wait_ended(client, waiting.id)  # waiting for A's slot, it would not end before A's request is released
    assert client.messages.batches.retrieve(busy.id).processing_status == "in_progress"  # A still holds the slot
    assert counts(ended) == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 2}
    release.set()


def test_the_results_url_is_the_gateway_as_the_asking_client_reached_it(start):
    """Never the Host a batch's creator sent: the SDK sends its key to that URL."""
    gateway = start()
    creator = anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=5,
                                  default_headers={"host": "attacker.example:9999"})  # fmt: skip
    batch = creator.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    reader = sdk(gateway)
    seen = wait_ended(reader, batch.id)
    assert seen.results_url == f"{gateway.url}/v1/messages/batches/{batch.id}/results"
    assert [r.custom_id for r in reader.messages.batches.results(batch.id)] == ["a"]


def test_an_unreadable_params_is_named_where_the_batch_request_holds_it(start):
    client = sdk(start())
    batch = client.messages.batches.create(requests=[
        {"custom_id": "int", "params": 5},
        {"custom_id": "nokey", "params": {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}},
    ])  # fmt: skip
    wait_ended(client, batch.id)
    errors = {r.custom_id: r.result.error.error.message for r in client.messages.batches.results(batch.id)}
    assert errors["int"].startswith("requests.0.params: ") and errors["nokey"].startswith(
        "requests.1.params.max_tokens: "
    )


def test_deleting_while_paging_through_the_list_reaches_every_batch(start):
    """The cleanup loop SDK users write: the cursor names a batch deleted a moment ago."""
    client = sdk(start())
    made = [client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}]).id for _ in range(5)]
    for batch_id in made:
        wait_ended(client, batch_id)
    deleted = []
    for batch in client.messages.batches.list(limit=2):
        client.messages.batches.delete(batch.id)
        deleted.append(batch.id)
    assert deleted == made[::-1]


def test_a_batch_waits_for_a_full_upstream_instead_of_erroring(start, upstream):
    """The upstream's queue (max_queue) bounds interactive requests; batch requests wait."""
    answer_per_marker(upstream, hang=0.1)
    client = sdk(
        start(
            batches={"max_concurrent": 4},
            upstreams={"default": {"url": upstream.url, "max_retries": 0, "max_concurrent": 1, "max_queue": 1}},
        )
    )
    batch = client.messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"r{i}")} for i in range(4)]
    )
    ended = wait_ended(client, batch.id)
    assert (ended.request_counts.succeeded, ended.request_counts.errored) == (4, 0)


def test_a_thinking_budget_is_checked_per_request_with_the_create_requests_betas(start, upstream):
    """As on POST /v1/messages: each request's thinking checked when it runs, the error naming
    the field where the batch request holds it; the beta header of the create request applies
    to every request of the batch."""
    answer_per_marker(upstream)
    client = sdk(start())
    requests = [
        {
            "custom_id": "low",
            "params": params("low", max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 512}),
        },
        {
            "custom_id": "past-max",
            "params": params("past", max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 4000}),
        },
        {
            "custom_id": "ok",
            "params": params("ok", max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 2048}),
        },
    ]
    plain = wait_ended(client, client.messages.batches.create(requests=requests).id)
    interleaved = client.beta.messages.batches.create(requests=requests, betas=["interleaved-thinking-2025-05-14"])
    with_beta = wait_ended(client, interleaved.id)

    assert counts(plain) == {"processing": 0, "succeeded": 1, "errored": 2, "canceled": 0, "expired": 0}
    results = results_of(client, plain.id)
    for custom_id, expected in (
        ("low", "requests.0.params.thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (
            "past-max",
            "requests.1.params: `max_tokens` must be greater than `thinking.budget_tokens`.",
        ),  # Anthropic's words name no field
    ):
        assert results[custom_id].type == "errored"
        assert results[custom_id].error.error.type == "invalid_request_error"
        assert results[custom_id].error.error.message.startswith(expected)
    assert counts(with_beta) == {"processing": 0, "succeeded": 2, "errored": 1, "canceled": 0, "expired": 0}
    assert results_of(client, with_beta.id)["past-max"].type == "succeeded"
    assert sorted(marker_of(body) for body in upstream.requests) == ["ok", "ok", "past"]


def test_an_upstreams_refusal_keeps_its_own_words(start, upstream):
    """Only what the gateway finds wrong with the params is named from the batch request;
    an upstream's 400 is reported as the upstream said it."""
    upstream.responder = lambda body: Reply(
        status=400, body={"error": {"message": "prompt refused", "type": "invalid_request_error"}}
    )
    client = sdk(start())
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    wait_ended(client, batch.id)
    [line] = client.messages.batches.results(batch.id)
    assert line.result.type == "errored" and line.result.error.error.type == "invalid_request_error"
    message = line.result.error.error.message
    assert message.startswith("upstream default answered 400: ") and message.endswith("prompt refused"), message
