"""Files kept in `files.dir` across a restart and shared by two gateways; the
gateway's API keys on every files route, each key seeing only its own files (unless
`share_between_keys`), and a store with no files yet."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.envelopes import error_of, raw_error
from tests.support.files_scaffold import MODEL, ask, document_file, image_file, on_disk, path_of, sdk, stored
from tests.support.waiting import eventually


def test_files_survive_a_restart(start, upstream, files_dir):
    first = start()
    meta = sdk(first).beta.files.upload(file=("memo.txt", b"remembered text", "text/plain"))
    first.stop()

    second = start()
    client = sdk(second)
    assert client.beta.files.retrieve_metadata(meta.id) == meta
    assert [f.id for f in client.beta.files.list().data] == [meta.id]
    client.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(meta.id)))
    assert "remembered text" in json.dumps(upstream.requests[-1]["messages"])


def test_two_gateways_on_one_directory_share_their_files(start, upstream, tmp_path):
    shared = tmp_path / "shared"
    one, two = sdk(start(directory=shared)), sdk(start(directory=shared))
    elsewhere = sdk(start(directory=tmp_path / "elsewhere"))

    from_one = one.beta.files.upload(file=("one.txt", b"written by one", "text/plain"))
    from_two = two.beta.files.upload(file=("two.txt", b"written by two", "text/plain"))

    for client in (one, two):
        assert [f.id for f in client.beta.files.list().data] == [from_two.id, from_one.id]
    assert two.beta.files.retrieve_metadata(from_one.id) == from_one
    two.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(from_one.id)))
    assert "written by one" in json.dumps(upstream.requests[-1]["messages"])
    assert elsewhere.beta.files.list().data == []  # another directory, other files

    two.beta.files.delete(from_one.id)
    with pytest.raises(anthropic.NotFoundError):
        one.beta.files.retrieve_metadata(from_one.id)
    assert [f.id for f in one.beta.files.list().data] == [from_two.id]


def test_api_keys_apply_to_every_files_route(start, files_dir):
    gateway = start(server={"api_keys": ["sk-files"]})
    good, wrong = sdk(gateway, "sk-files"), sdk(gateway, "sk-wrong")
    meta = good.beta.files.upload(file=("memo.txt", b"guarded", "text/plain"))

    for call in (
        lambda: wrong.beta.files.upload(file=("x.txt", b"x", "text/plain")),
        wrong.beta.files.list,
        lambda: wrong.beta.files.retrieve_metadata(meta.id),
        lambda: wrong.beta.files.download(meta.id),
        lambda: wrong.beta.files.delete(meta.id),
        lambda: wrong.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(meta.id))),
    ):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            call()
        error_of(caught, 401, "authentication_error")

    base = f"{gateway.url}/v1/files"
    for method, url, kwargs in (
        ("POST", base, {"files": {"file": ("x.txt", b"x", "text/plain")}}),
        ("POST", base, {"content": b"x" * 300, "headers": {"content-type": "text/plain"}}),  # 401 before any check of the body
        ("GET", base, {}), ("GET", f"{base}/{meta.id}", {}), ("GET", f"{base}/{meta.id}/content", {}),
        ("DELETE", f"{base}/{meta.id}", {}), ("GET", f"{base}/file_011Unknown", {}),  # 401 before 404: no probing for ids
    ):  # fmt: skip
        raw_error(httpx.request(method, url, timeout=5, **kwargs), 401, "authentication_error")

    assert stored(files_dir) == {meta.id}  # the refused upload and delete did nothing
    bearer = httpx.get(base, headers={"authorization": "Bearer sk-files"}, timeout=5)
    assert [f["id"] for f in bearer.json()["data"]] == [meta.id]
    assert good.beta.files.delete(meta.id).type == "file_deleted"


def test_a_key_sees_only_its_own_files(start, upstream):
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    mine = a.beta.files.upload(file=("memo.txt", b"for a only", "text/plain"))

    assert b.beta.files.list().data == []
    for call in (b.beta.files.retrieve_metadata, b.beta.files.download, b.beta.files.delete):
        with pytest.raises(anthropic.NotFoundError) as theirs:
            call(mine.id)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            call("file_011NoSuchFile")
        assert error_of(theirs, 404, "not_found_error") == error_of(unknown, 404, "not_found_error").replace(
            "file_011NoSuchFile", mine.id
        )
    with pytest.raises(anthropic.NotFoundError) as caught:  # as an unknown id is, on the translating path
        b.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(mine.id)))
    assert "messages.0.content.0.source.file_id" in error_of(caught, 404, "not_found_error")
    with pytest.raises(anthropic.NotFoundError) as caught:
        b.messages.count_tokens(model=MODEL, messages=ask(document_file(mine.id)))
    assert "messages.0.content.0.source.file_id" in error_of(caught, 404, "not_found_error")
    assert upstream.requests == []

    def listed(key: str, **query: Any) -> httpx.Response:
        return httpx.get(f"{gateway.url}/v1/files", params=query, headers={"x-api-key": key}, timeout=5)

    assert listed("sk-b", **{"ids[]": mine.id}).json()["data"] == []
    raw_error(listed("sk-b", after_id=mine.id), 400, "invalid_request_error")  # an unknown cursor, as any unknown id
    assert [f["id"] for f in listed("sk-a").json()["data"]] == [mine.id]
    assert set(listed("sk-a").json()["data"][0]) == {
        "id",
        "created_at",
        "filename",
        "mime_type",
        "size_bytes",
        "type",
        "downloadable",
    }

    theirs = b.beta.files.upload(file=("other.txt", b"for b", "text/plain"))
    assert [f.id for f in a.beta.files.list().data] == [mine.id]
    assert [f.id for f in b.beta.files.list().data] == [theirs.id]
    assert a.beta.files.retrieve_metadata(mine.id) == mine  # B's attempts changed nothing
    a.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(mine.id)))
    assert "for a only" in json.dumps(upstream.requests[-1]["messages"])
    assert a.beta.files.delete(mine.id).id == mine.id


def test_passthrough_forwards_another_keys_file_id_as_sent(start, native):
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]}, native=native)
    mine = sdk(gateway, "sk-a").beta.files.upload(file=("memo.txt", b"for a only", "text/plain"))
    sdk(gateway, "sk-b").messages.create(model="claude-test", max_tokens=10, messages=ask(document_file(mine.id)))
    assert native.requests[0][1]["messages"][0]["content"][0]["source"] == {"type": "file", "file_id": mine.id}
    assert "for a only" not in json.dumps(native.requests[0][1])


def test_keys_that_share_see_each_others_files(start, upstream):
    gateway = start(server={"api_keys": ["sk-a", "sk-b"], "share_between_keys": True})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    memo = a.beta.files.upload(file=("memo.txt", b"shared memo", "text/plain"))

    assert [f.id for f in b.beta.files.list().data] == [memo.id]
    assert b.beta.files.retrieve_metadata(memo.id) == memo
    b.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(memo.id)))
    assert "shared memo" in json.dumps(upstream.requests[-1]["messages"])
    assert b.beta.files.delete(memo.id).id == memo.id
    assert a.beta.files.list().data == []


def test_without_keys_every_caller_sees_every_file(start, upstream):
    gateway = start()
    one, other = sdk(gateway, "any key"), sdk(gateway, "another key")  # no keys configured: the key is not looked at
    memo = one.beta.files.upload(file=("memo.txt", b"open memo", "text/plain"))
    assert [f.id for f in other.beta.files.list().data] == [memo.id]
    assert other.beta.files.retrieve_metadata(memo.id) == memo
    other.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(memo.id)))
    assert "open memo" in json.dumps(upstream.requests[-1]["messages"])


def test_a_file_stored_before_owners_were_recorded_is_served_without_keys(start, upstream, files_dir):
    files_dir.mkdir(mode=0o700)
    old = {"id": "file_011Old", "created_at": "2025-01-01T00:00:00.000000Z", "filename": "old.txt",
           "mime_type": "text/plain", "size_bytes": 7, "type": "file", "downloadable": False}  # fmt: skip
    (files_dir / "file_011Old.json").write_text(json.dumps(old))  # the metadata as written before: no owner
    (files_dir / "file_011Old").write_bytes(b"old one")

    client = sdk(start())

    def moved() -> bool:  # into the owner's directory at start-up, in the background; served meanwhile
        assert [f.id for f in client.beta.files.list().data] == ["file_011Old"]
        return not (files_dir / "file_011Old.json").exists()

    eventually(moved, "the old file moved into its owner's directory", timeout=10)
    assert (
        on_disk(files_dir) == ["file_011Old", "file_011Old.json"]
        and path_of(files_dir, "file_011Old").parent.name == "shared"
    )
    assert [f.id for f in client.beta.files.list().data] == ["file_011Old"]
    assert client.beta.files.retrieve_metadata("file_011Old").filename == "old.txt"
    client.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file("file_011Old")))
    assert "old one" in json.dumps(upstream.requests[-1]["messages"])

    keyed = sdk(start(server={"api_keys": ["sk-a"]}), "sk-a")  # a key's own files only: not this one
    assert keyed.beta.files.list().data == []
    with pytest.raises(anthropic.NotFoundError):
        keyed.beta.files.retrieve_metadata("file_011Old")


def test_unknown_file_ids_are_404_before_any_file_was_uploaded(start, upstream, files_dir):
    client = sdk(start())
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=ask(image_file("file_011Missing")))
    assert "messages.0.content.0.source.file_id" in error_of(caught, 404, "not_found_error")
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
                                                              {"role": "user", "content": ask(document_file("file_011Missing"))[0]["content"]}])  # fmt: skip
    assert "messages.2.content.0.source.file_id" in error_of(caught, 404, "not_found_error")
    assert upstream.requests == []
    assert not files_dir.exists()  # nothing was written


def test_passthrough_forwards_unknown_file_ids_before_any_file_was_uploaded(start, native):
    client = sdk(start(native=native))
    client.messages.create(model="claude-test", max_tokens=10, messages=ask(image_file("file_011Missing")))
    assert native.requests[0][1]["messages"][0]["content"][0]["source"] == {
        "type": "file",
        "file_id": "file_011Missing",
    }


def test_a_file_uploaded_through_another_gateway_is_usable_at_once(start, upstream, native, tmp_path):
    shared = tmp_path / "shared"
    uploader = sdk(start(directory=shared))
    translating, passthrough = sdk(start(directory=shared)), sdk(start(directory=shared, native=native))
    translating.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "warm up"}])
    passthrough.messages.create(model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "warm up"}])

    memo = uploader.beta.files.upload(file=("memo.txt", b"fresh memo", "text/plain"))
    outcomes = []
    for client, model in ((translating, MODEL), (passthrough, "claude-test")):
        try:
            client.messages.create(model=model, max_tokens=10, messages=ask(document_file(memo.id)))
            outcomes.append("ok")
        except anthropic.APIStatusError as error:
            outcomes.append(f"{error.status_code}: {error.body}")
    assert outcomes == ["ok", "ok"]
    assert "fresh memo" in json.dumps(upstream.requests[-1]["messages"])
    assert "file_id" not in json.dumps(native.requests[-1][1])


def test_deleting_while_paging_through_the_files_reaches_every_file(start):
    client = sdk(start())
    uploaded = [client.beta.files.upload(file=(f"f{i}.txt", b"x", "text/plain")).id for i in range(5)]
    deleted = []
    for meta in client.beta.files.list(limit=2):
        client.beta.files.delete(meta.id)
        deleted.append(meta.id)
    assert deleted == uploaded[::-1]
