"""The Message Batches API over a real socket, driven by the official SDK: create,
retrieve, list (newest first, paginated), cancel, delete, results as JSONL; params
validated when each request runs. Expiry, retention, the concurrency bound, API keys and
passthrough: test_batch_limits.py."""

from __future__ import annotations

import json
import threading

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
from tests.support.waiting import eventually


def test_batch_runs_every_request_and_reports_results_by_custom_id(start, upstream):
    answer_per_marker(upstream)
    gateway = start()
    client = sdk(gateway)
    requests = [{"custom_id": f"req-{i}", "params": params(f"q{i}")} for i in range(4)]

    created = client.messages.batches.create(requests=requests)

    assert created.type == "message_batch" and created.id.startswith("msgbatch_")
    assert created.processing_status == "in_progress"
    assert counts(created) == {"processing": 4, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    assert created.ended_at is None and created.results_url is None and created.cancel_initiated_at is None
    assert abs((created.expires_at - created.created_at).total_seconds() - 24 * 3600) < 1

    ended = wait_ended(client, created.id)
    assert ended.id == created.id and ended.created_at == created.created_at
    assert counts(ended) == {"processing": 0, "succeeded": 4, "errored": 0, "canceled": 0, "expired": 0}
    assert ended.ended_at is not None and ended.ended_at >= ended.created_at
    assert ended.cancel_initiated_at is None
    assert ended.results_url == f"{gateway.url}/v1/messages/batches/{created.id}/results"

    results = results_of(client, created.id)
    assert sorted(results) == [f"req-{i}" for i in range(4)]
    for i in range(4):
        result = results[f"req-{i}"]
        assert result.type == "succeeded"
        assert result.message.type == "message" and result.message.role == "assistant"
        assert result.message.id.startswith("msg_")
        assert [b.text for b in result.message.content] == [f"answer to q{i}"]
        assert result.message.model == "test-model"
        assert result.message.stop_reason == "end_turn"
        assert (result.message.usage.input_tokens, result.message.usage.output_tokens) == (11, 4)
    assert sorted(marker_of(body) for body in upstream.requests) == [f"q{i}" for i in range(4)]

    # The results URL serves JSON Lines: exactly {custom_id, result} per line.
    raw = httpx.get(ended.results_url, headers={"x-api-key": KEY}, timeout=5)
    assert raw.status_code == 200
    lines = [json.loads(line) for line in raw.text.splitlines() if line]
    assert len(lines) == 4 and all(set(line) == {"custom_id", "result"} for line in lines)


def test_mixed_outcomes_are_validated_when_run_not_at_create(start, upstream):
    answer_per_marker(upstream, fail=("upstream500",))
    client = sdk(start())
    no_max_tokens = params("nomax")
    del no_max_tokens["max_tokens"]
    requests = [
        {"custom_id": "ok", "params": params("ok")},
        {"custom_id": "no-max-tokens", "params": no_max_tokens},
        {"custom_id": "unknown-model", "params": params("unknown", model="no-such-model")},
        {"custom_id": "streaming", "params": params("streaming", stream=True)},
        {"custom_id": "threaded", "params": params("threaded", thread={"type": "create"})},
        {"custom_id": "upstream-fails", "params": params("upstream500")},
    ]

    created = client.messages.batches.create(requests=requests)  # not refused
    assert counts(created)["processing"] == 6
    ended = wait_ended(client, created.id)

    assert counts(ended) == {"processing": 0, "succeeded": 1, "errored": 5, "canceled": 0, "expired": 0}
    results = results_of(client, created.id)
    assert results["ok"].type == "succeeded"
    assert results["ok"].message.content[0].text == "answer to ok"

    def errored(custom_id: str, error_type: str) -> str:
        result = results[custom_id]
        assert result.type == "errored", result
        assert result.error.type == "error"  # Anthropic's error envelope
        assert result.error.error.type == error_type, result.error
        return result.error.error.message

    assert errored("no-max-tokens", "invalid_request_error").startswith("requests.1.params.max_tokens: ")
    assert errored("unknown-model", "not_found_error").startswith("requests.2.params.model: 'no-such-model'")
    assert errored("streaming", "invalid_request_error").startswith("requests.3.params.stream: ")
    assert errored("threaded", "invalid_request_error").startswith("requests.4.params.thread:")
    errored("upstream-fails", "api_error")
    # Only the requests that were valid reached the upstream.
    assert sorted(marker_of(body) for body in upstream.requests) == ["ok", "upstream500"]


def test_list_is_newest_first_and_paginates(start, upstream):
    client = sdk(start())
    made = [client.messages.batches.create(requests=[{"custom_id": "only", "params": params()}]).id for _ in range(5)]
    newest_first = made[::-1]

    everything = client.messages.batches.list()
    assert [b.id for b in everything.data] == newest_first
    assert everything.has_more is False
    assert (everything.first_id, everything.last_id) == (newest_first[0], newest_first[-1])
    assert all(b.type == "message_batch" for b in everything.data)

    first = client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2]
    assert first.has_more is True
    assert (first.first_id, first.last_id) == (newest_first[0], newest_first[1])

    second = client.messages.batches.list(limit=2, after_id=first.last_id)
    assert [b.id for b in second.data] == newest_first[2:4] and second.has_more is True

    third = client.messages.batches.list(limit=2, after_id=second.last_id)
    assert [b.id for b in third.data] == newest_first[4:] and third.has_more is False

    # before_id: the items just before it in the listing, has_more when there are earlier ones.
    back = client.messages.batches.list(limit=2, before_id=newest_first[3])
    assert [b.id for b in back.data] == newest_first[1:3] and back.has_more is True
    front = client.messages.batches.list(limit=2, before_id=newest_first[1])
    assert [b.id for b in front.data] == newest_first[:1] and front.has_more is False

    # The SDK's auto-pagination walks every page, in both directions.
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    assert [b.id for b in client.messages.batches.list(limit=1, before_id=newest_first[-1])] == newest_first[-2::-1]

    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.list(limit=0)
    assert "limit" in error_of(caught, 400, "invalid_request_error")

    for batch_id in made:  # leave nothing running at teardown
        wait_ended(client, batch_id)


def test_cancel_ends_unstarted_requests_as_canceled_and_lets_the_running_one_finish(start, upstream):
    canceled = threading.Event()
    answer_per_marker(upstream, hold=canceled)  # the first request is in flight until the cancel is made
    client = sdk(start(batches={"max_concurrent": 1}))
    created = client.messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(4)]
    )
    eventually(lambda: len(upstream.requests) == 1)  # one running, three waiting

    canceling = client.messages.batches.cancel(created.id)
    assert canceling.id == created.id
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None and canceling.ended_at is None and canceling.results_url is None
    assert counts(canceling)["processing"] == 4
    assert client.messages.batches.retrieve(created.id).processing_status == "canceling"
    canceled.set()

    ended = wait_ended(client, created.id)
    assert counts(ended) == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 3, "expired": 0}
    assert ended.cancel_initiated_at == canceling.cancel_initiated_at
    assert ended.ended_at >= ended.cancel_initiated_at

    results = results_of(client, created.id)
    assert sorted(results) == ["r0", "r1", "r2", "r3"]
    ran = marker_of(upstream.requests[0])  # the one already running finished normally
    assert len(upstream.requests) == 1
    started = f"r{ran[1:]}"
    assert results[started].type == "succeeded" and results[started].message.content[0].text == f"answer to {ran}"
    assert sorted(cid for cid, result in results.items() if result.type == "canceled") == sorted(
        set(results) - {started}
    )


def test_results_and_delete_are_refused_while_the_batch_is_processing(start, upstream):
    checked = threading.Event()
    answer_per_marker(upstream, hold=checked)  # processing until every refusal below has been seen
    gateway = start()
    client = sdk(gateway)
    created = client.messages.batches.create(requests=[{"custom_id": "slow", "params": params()}])

    raw = httpx.get(f"{gateway.url}/v1/messages/batches/{created.id}/results", headers={"x-api-key": KEY}, timeout=5)
    assert "not ended" in raw_error(raw, 400, "invalid_request_error")
    with pytest.raises(anthropic.AnthropicError, match="results_url"):  # the SDK sees no results_url yet
        client.messages.batches.results(created.id)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.delete(created.id)
    error_of(caught, 400, "invalid_request_error")

    client.messages.batches.cancel(created.id)
    with pytest.raises(anthropic.BadRequestError) as caught:  # canceling is not ended either
        client.messages.batches.delete(created.id)
    error_of(caught, 400, "invalid_request_error")
    checked.set()

    ended = wait_ended(client, created.id)  # the refused delete did not remove it
    assert counts(ended)["succeeded"] == 1


def test_delete_after_the_end_removes_the_batch(start, upstream):
    gateway = start()
    client = sdk(gateway)
    kept = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    doomed = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    wait_ended(client, kept.id)
    wait_ended(client, doomed.id)

    deleted = client.messages.batches.delete(doomed.id)
    assert (deleted.id, deleted.type) == (doomed.id, "message_batch_deleted")

    for call in (
        client.messages.batches.retrieve, client.messages.batches.delete,
        client.messages.batches.cancel, client.messages.batches.results,
    ):  # fmt: skip
        with pytest.raises(anthropic.NotFoundError) as caught:
            call(doomed.id)
        error_of(caught, 404, "not_found_error")
    raw = httpx.get(f"{gateway.url}/v1/messages/batches/{doomed.id}/results", headers={"x-api-key": KEY}, timeout=5)
    raw_error(raw, 404, "not_found_error")
    assert [b.id for b in client.messages.batches.list().data] == [kept.id]
    assert results_of(client, kept.id)["a"].type == "succeeded"


def test_unknown_batch_ids_are_404(start, upstream):
    gateway = start()
    client = sdk(gateway)
    unknown = "msgbatch_01nosuchbatch"
    for call in (
        client.messages.batches.retrieve, client.messages.batches.cancel,
        client.messages.batches.delete, client.messages.batches.results,
    ):  # fmt: skip
        with pytest.raises(anthropic.NotFoundError) as caught:
            call(unknown)
        assert unknown in error_of(caught, 404, "not_found_error")
    raw = httpx.get(f"{gateway.url}/v1/messages/batches/{unknown}/results", headers={"x-api-key": KEY}, timeout=5)
    raw_error(raw, 404, "not_found_error")
    assert upstream.requests == []


def _refused(client: anthropic.Anthropic, requests: list[dict]) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.create(requests=requests)
    return error_of(caught, 400, "invalid_request_error")


def test_empty_batch_is_refused(start, upstream):
    client = sdk(start())
    assert "requests" in _refused(client, [])
    assert client.messages.batches.list().data == []


def test_more_than_max_requests_is_refused(start, upstream):
    client = sdk(start(batches={"max_requests": 3}))
    message_text = _refused(client, [{"custom_id": f"r{i}", "params": params()} for i in range(4)])
    assert "requests" in message_text and "3" in message_text
    assert client.messages.batches.list().data == []
    exactly = client.messages.batches.create(requests=[{"custom_id": f"r{i}", "params": params()} for i in range(3)])
    assert counts(wait_ended(client, exactly.id))["succeeded"] == 3


@pytest.mark.parametrize("bad", ["", "has space", "a" * 65, "dot.ted", "ünïcode", "new\nline", "slash/id"])
def test_malformed_custom_id_is_refused(start, upstream, bad):
    client = sdk(start())
    message_text = _refused(client, [{"custom_id": "fine", "params": params()}, {"custom_id": bad, "params": params()}])
    assert "requests.1.custom_id" in message_text
    assert client.messages.batches.list().data == []
    assert upstream.requests == []


def test_longest_and_every_allowed_character_custom_id_are_accepted(start, upstream):
    client = sdk(start())
    ids = ["a" * 64, "AZaz09_-", "x"]
    created = client.messages.batches.create(requests=[{"custom_id": i, "params": params()} for i in ids])
    wait_ended(client, created.id)
    assert sorted(results_of(client, created.id)) == sorted(ids)


def test_duplicate_custom_id_is_refused_naming_the_later_one(start, upstream):
    client = sdk(start())
    requests = [{"custom_id": cid, "params": params()} for cid in ("a", "b", "a")]
    message_text = _refused(client, requests)
    assert "requests.2.custom_id" in message_text and "'a'" in message_text
    assert client.messages.batches.list().data == []
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "object"),
        (b"{}", "requests"),
        (b'{"requests": "no"}', "requests"),
        (b'{"requests": [{"custom_id": "a"}]}', "requests.0.params"),
        (b'{"requests": [{"custom_id": 5, "params": {}}]}', "requests.0.custom_id"),
        (b'{"requests": [{"custom_id": "a", "params": {}, "extra": 1}]}', "extra"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-requests",
        "requests-not-a-list",
        "no-params",
        "custom-id-not-a-string",
        "unknown-field",
    ],
)
def test_malformed_create_body_is_refused(start, upstream, body, named):
    gateway = start()
    response = httpx.post(
        f"{gateway.url}/v1/messages/batches", content=body,
        headers={"x-api-key": KEY, "content-type": "application/json"}, timeout=5,
    )  # fmt: skip
    assert named in raw_error(response, 400, "invalid_request_error")
    assert sdk(gateway).messages.batches.list().data == []
