"""Message Batches kept on disk, over real sockets with the official SDK: a batch outlives
the gateway that made it, every gateway sharing the directory (as `--workers` processes
do) sees and can cancel it, a batch whose gateway stopped is taken over and finished
without running a settled request again, and each API key sees only its own batches."""

from __future__ import annotations

import json
import threading

import anthropic
import pytest

from dragoman.batches import store as batch_store
from dragoman.batches.runs import BatchTimings
from tests.support.batches import (
    KEYS,
    answer_per_marker,
    counts,
    keeping_start,
    marker_of,
    params,
    results_of,
    sdk,
    wait_ended,
)
from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.helpers import batch_path
from tests.support.waiting import eventually

start = keeping_start  # the fixture: a gateway keeping its batches in the test's directory


def hang_on(upstream: FakeUpstream, slow: str) -> None:
    """Answer every marker at once, except `slow`, which hangs (in flight when the gateway stops)."""

    def respond(body: dict) -> Reply:
        marker = marker_of(body)
        return Reply(
            body=completion(f"answer to {marker}", prompt=11, completion_tokens=4), hang=30.0 if marker == slow else 0.0
        )

    upstream.responder = respond


def test_an_ended_batch_outlives_the_gateway_that_ran_it(start, upstream, tmp_path):
    answer_per_marker(upstream)
    first = start()
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(3)]
    )
    ended = wait_ended(sdk(first), created.id)
    before = results_of(sdk(first), created.id)
    first.stop()

    client = sdk(start())  # a new process on the same directory
    again = client.messages.batches.retrieve(created.id)
    assert again.processing_status == "ended" and counts(again) == counts(ended) == {
        "processing": 0, "succeeded": 3, "errored": 0, "canceled": 0, "expired": 0,
    }  # fmt: skip
    assert again.ended_at == ended.ended_at and again.created_at == created.created_at
    assert [b.id for b in client.messages.batches.list().data] == [created.id]
    after = results_of(client, created.id)
    assert {cid: r.message.content[0].text for cid, r in after.items()} == {
        cid: r.message.content[0].text for cid, r in before.items()
    }
    assert len(upstream.requests) == 3  # nothing ran again
    requests = batch_path(tmp_path / "batches", created.id) / "requests.json"
    assert not requests.exists()  # the results stand for them now


def test_a_batch_interrupted_by_shutdown_resumes_at_the_next_start_without_rerunning_settled_requests(start, upstream):
    hang_on(upstream, slow="m1")
    first = start(batches={"max_concurrent": 1})
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(4)]
    )
    eventually(lambda: [marker_of(b) for b in upstream.requests] == ["m0", "m1"])  # r0 settled, r1 in flight
    first.stop()
    assert [marker_of(b) for b in upstream.requests] == ["m0", "m1"]  # stopping ran nothing more

    answer_per_marker(upstream)
    client = sdk(start(batches={"max_concurrent": 1}))
    ended = wait_ended(client, created.id)
    assert counts(ended)["succeeded"] == 4
    results = results_of(client, created.id)
    assert {cid: r.message.content[0].text for cid, r in results.items()} == {
        f"r{i}": f"answer to m{i}" for i in range(4)
    }
    assert sorted(marker_of(b) for b in upstream.requests) == [
        "m0",
        "m1",
        "m1",
        "m2",
        "m3",
    ]  # only the one in flight ran twice


def test_every_gateway_on_the_directory_sees_a_batch_and_can_cancel_it(start, upstream):
    cancel_stored = threading.Event()
    answer_per_marker(
        upstream, hold=cancel_stored
    )  # r0 stays in flight until the cancel is on disk, however loaded the machine
    runner = start(batches={"max_concurrent": 1})
    created = sdk(runner).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(4)]
    )
    eventually(lambda: len(upstream.requests) == 1)
    other = (
        start()
    )  # only now: started before, its first sweep could lock the batch before `runner` (any process may run it)
    seen = sdk(other).messages.batches.retrieve(created.id)
    assert seen.processing_status == "in_progress" and counts(seen)["processing"] == 4
    assert [b.id for b in sdk(other).messages.batches.list().data] == [created.id]

    canceling = sdk(other).messages.batches.cancel(created.id)  # not the process running it
    assert canceling.processing_status == "canceling"
    assert sdk(runner).messages.batches.retrieve(created.id).processing_status == "canceling"
    cancel_stored.set()  # r0 settles; the runner's next start finds the cancel and runs nothing more

    ended = wait_ended(sdk(other), created.id)
    assert counts(ended) == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 3, "expired": 0}
    assert ended.cancel_initiated_at == canceling.cancel_initiated_at
    assert sorted(r.type for r in results_of(sdk(other), created.id).values()) == ["canceled"] * 3 + ["succeeded"]
    assert len(upstream.requests) == 1


def test_the_gateway_running_a_batch_says_ended_as_soon_as_the_others_do(start, upstream, monkeypatch):
    """Once the outcome is on disk every other gateway says `ended`; the one that ran the
    batch must too, not `in_progress` until its own bookkeeping catches up (a client whose
    requests go to several `--workers` would see the batch end and then un-end)."""
    answer_per_marker(upstream)
    written, finish = threading.Event(), threading.Event()
    real_end = batch_store.BatchDir.end

    def end(self: batch_store.BatchDir, ended: batch_store.Ended) -> None:
        real_end(self, ended)
        written.set()
        finish.wait(10)  # the running gateway's bookkeeping after the write, held back

    monkeypatch.setattr(batch_store.BatchDir, "end", end)
    runner = start()
    created = sdk(runner).messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    assert written.wait(10)
    try:
        assert sdk(start()).messages.batches.retrieve(created.id).processing_status == "ended"  # another gateway
        assert sdk(runner).messages.batches.retrieve(created.id).processing_status == "ended"
        assert [r.type for r in results_of(sdk(runner), created.id).values()] == ["succeeded"]
    finally:
        finish.set()


def test_a_live_gateway_takes_over_a_batch_whose_gateway_stopped(start, upstream, monkeypatch):
    timings = BatchTimings(adopt_every=0.1)
    hang_on(upstream, slow="m0")
    first = start(batches={"max_concurrent": 1}, timings=timings)
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(2)]
    )
    eventually(lambda: len(upstream.requests) == 1)
    second = start(
        timings=timings
    )  # only now: started before, a sweep of its own could lock the batch before `first` (any process may run it)
    answer_per_marker(upstream)
    first.stop()

    ended = wait_ended(sdk(second), created.id)
    assert counts(ended)["succeeded"] == 2
    assert sorted(marker_of(b) for b in upstream.requests) == ["m0", "m0", "m1"]


def test_only_one_of_two_gateways_takes_over_a_batch(start, upstream, monkeypatch):
    timings = BatchTimings(adopt_every=0.05)
    hang_on(upstream, slow="m0")
    first = start(batches={"max_concurrent": 1}, timings=timings)
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(3)]
    )
    eventually(lambda: len(upstream.requests) == 1)
    first.stop()
    answer_per_marker(upstream, hang=0.05)
    second, third = start(timings=timings), start(timings=timings)

    ended = wait_ended(sdk(third), created.id)
    assert counts(ended)["succeeded"] == 3
    assert sorted(marker_of(b) for b in upstream.requests) == ["m0", "m0", "m1", "m2"]  # each ran once after the stop
    assert len(results_of(sdk(second), created.id)) == 3


def test_a_result_line_cut_short_by_a_crash_is_run_again(start, upstream, tmp_path):
    hang_on(upstream, slow="m1")
    first = start(batches={"max_concurrent": 1})
    created = sdk(first).messages.batches.create(
        requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(2)]
    )
    eventually(lambda: len(upstream.requests) == 2)
    first.stop()
    results = batch_path(tmp_path / "batches", created.id) / "results.jsonl"
    whole = results.read_bytes()
    assert whole.count(b"\n") == 1 and json.loads(whole)["custom_id"] == "r0"
    results.write_bytes(whole[:-20])  # as if the process died in the middle of writing it

    answer_per_marker(upstream)
    client = sdk(start())
    wait_ended(client, created.id)
    assert sorted(results_of(client, created.id)) == ["r0", "r1"]
    assert sorted(marker_of(b) for b in upstream.requests) == ["m0", "m0", "m1", "m1"]


def test_each_key_sees_only_its_own_batches(start, upstream):
    answer_per_marker(upstream, hang=0.3)
    gateway = start(server={"api_keys": KEYS})
    mine, theirs = sdk(gateway, "key-a"), sdk(gateway, "key-b")
    created = mine.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    assert theirs.messages.batches.list().data == []
    for attempt in (
        lambda: theirs.messages.batches.retrieve(created.id),
        lambda: theirs.messages.batches.cancel(created.id),
    ):
        with pytest.raises(anthropic.NotFoundError) as caught:
            attempt()
        assert caught.value.body["error"]["type"] == "not_found_error"
        assert created.id in caught.value.body["error"]["message"]
    wait_ended(mine, created.id)
    for attempt in (
        lambda: list(theirs.messages.batches.results(created.id)),
        lambda: theirs.messages.batches.delete(created.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            attempt()
    assert [b.id for b in mine.messages.batches.list().data] == [created.id]
    assert mine.messages.batches.delete(created.id).id == created.id


def test_keys_share_batches_when_configured(start, upstream):
    answer_per_marker(upstream)
    gateway = start(server={"api_keys": KEYS, "share_between_keys": True})
    created = sdk(gateway, "key-a").messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    wait_ended(sdk(gateway, "key-b"), created.id)
    assert [b.id for b in sdk(gateway, "key-b").messages.batches.list().data] == [created.id]
    assert sorted(results_of(sdk(gateway, "key-b"), created.id)) == ["a"]


def test_retention_removes_the_batch_from_disk(start, upstream, tmp_path):
    answer_per_marker(upstream)
    client = sdk(start(batches={"retain_for": 0.2}))
    created = client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    wait_ended(client, created.id)
    assert batch_path(tmp_path / "batches", created.id).is_dir()
    eventually(lambda: client.messages.batches.list().data == [])
    assert not batch_path(tmp_path / "batches", created.id).exists()


def test_an_unwritable_directory_is_an_api_error_not_a_500(start, upstream, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    client = sdk(start(batches={"dir": str(blocker / "batches")}))
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    assert caught.value.status_code == 500 and caught.value.body["error"]["type"] == "api_error"
    assert "could not store the batch" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.batches.list()
    assert caught.value.status_code == 500 and "could not read the batches" in caught.value.body["error"]["message"]


def test_a_key_with_too_many_requests_queued_is_told_to_wait(start, upstream):
    """batches.max_queued_requests bounds the requests in one key's batches still processing:
    past it a create is a 429 naming the setting; other keys are not held back, and the
    key may create again once its batches end."""
    checked = threading.Event()
    answer_per_marker(upstream, hold=checked)  # the first batch is processing until the limit has been checked
    gateway = start(server={"api_keys": KEYS}, batches={"max_queued_requests": 3, "max_concurrent": 1})
    mine, theirs = sdk(gateway, "key-a"), sdk(gateway, "key-b")
    first = mine.messages.batches.create(requests=[{"custom_id": f"r{i}", "params": params(f"m{i}")} for i in range(2)])
    with pytest.raises(anthropic.RateLimitError) as caught:
        mine.messages.batches.create(requests=[{"custom_id": f"s{i}", "params": params()} for i in range(2)])
    error = caught.value.body["error"]
    assert error["type"] == "rate_limit_error" and error["message"].startswith("batches.max_queued_requests")
    assert "2 requests" in error["message"] and "limit of 3" in error["message"]
    assert [b.id for b in mine.messages.batches.list().data] == [first.id]  # nothing stored
    theirs.messages.batches.create(requests=[{"custom_id": "t", "params": params()}])  # another key's queue
    mine.messages.batches.create(requests=[{"custom_id": "one", "params": params()}])  # fits: 2 + 1
    checked.set()
    wait_ended(mine, first.id)
    mine.messages.batches.create(requests=[{"custom_id": f"u{i}", "params": params()} for i in range(2)])


def test_keys_of_one_tenant_share_batches_and_files(start, upstream):
    """server.tenants: a rotated key (old and new in one tenant) keeps the tenant's batches
    and files; a key of another tenant, or a plain key, sees none of them."""
    answer_per_marker(upstream)
    gateway = start(server={"api_keys": ["sk-solo"], "tenants": {"team-a": ["sk-old", "sk-new"], "team-b": ["sk-b"]}})
    old, new, other, solo = (sdk(gateway, key) for key in ("sk-old", "sk-new", "sk-b", "sk-solo"))
    created = old.messages.batches.create(requests=[{"custom_id": "a", "params": params()}])
    uploaded = old.beta.files.upload(file=("n.txt", b"note", "text/plain"))
    assert [b.id for b in new.messages.batches.list().data] == [created.id]
    assert sorted(results_of(new, wait_ended(new, created.id).id)) == ["a"]
    assert new.beta.files.retrieve_metadata(uploaded.id).id == uploaded.id
    for outsider in (other, solo):
        assert outsider.messages.batches.list().data == []
        with pytest.raises(anthropic.NotFoundError):
            outsider.messages.batches.retrieve(created.id)
        with pytest.raises(anthropic.NotFoundError):
            outsider.beta.files.retrieve_metadata(uploaded.id)


def test_a_cancel_that_raced_the_end_of_its_batch_is_not_shown_after_the_end(start, upstream, tmp_path):
    from dragoman.batches.store import BatchDir

    answer_per_marker(upstream)
    client = sdk(start())
    created = client.messages.batches.create(requests=[{"custom_id": "r0", "params": params("m0")}])
    ended = wait_ended(client, created.id)
    # As when a cancel found the batch running and its marker was written just after the end:
    BatchDir(batch_path(tmp_path / "batches", created.id)).cancel(ended.ended_at.timestamp() + 0.5)

    again = client.messages.batches.retrieve(created.id)
    assert again.processing_status == "ended" and again.cancel_initiated_at is None
    assert counts(again)["succeeded"] == 1
