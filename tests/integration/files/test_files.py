"""The Files API over a real socket, driven by the official SDK (`client.beta.files`):
upload (multipart), list (newest first, paginated), retrieve metadata, download (refused,
as on Anthropic), delete; malformed and oversized uploads (raw httpx); the storage quota.
Every gateway here keeps its files under pytest's tmp_path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.envelopes import error_of, raw_error
from tests.support.files_scaffold import KEY, MODEL, PNG, ask, document_file, on_disk, path_of, sdk, stored


def test_upload_returns_file_metadata_and_keeps_the_file(start, files_dir):
    gateway = start()
    client = sdk(gateway)
    before = datetime.now(UTC)

    meta = client.beta.files.upload(file=("notes.txt", b"hello files", "text/plain"))

    assert meta.id.startswith("file_") and meta.type == "file"
    assert (meta.filename, meta.mime_type, meta.size_bytes, meta.downloadable) == ("notes.txt", "text/plain", 11, False)
    assert before - timedelta(seconds=1) <= meta.created_at <= datetime.now(UTC) + timedelta(seconds=1)
    assert client.beta.files.retrieve_metadata(meta.id) == meta
    assert stored(files_dir) == {meta.id}
    assert path_of(files_dir, meta.id).read_bytes() == b"hello files"  # the bytes as uploaded, in files.dir

    raw = httpx.get(f"{gateway.url}/v1/files/{meta.id}", headers={"x-api-key": KEY}, timeout=5)
    assert raw.status_code == 200, raw.text
    body = raw.json()
    assert set(body) == {"id", "created_at", "filename", "mime_type", "size_bytes", "type", "downloadable"}
    assert body["created_at"].endswith("Z") and body["downloadable"] is False


def expire_now(files_dir: Path, file_id: str) -> None:
    """Move a stored file's expires_at into the past, as time would."""
    path = path_of(files_dir, f"{file_id}.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "expires_at": "2020-01-01T00:00:00.000000Z"}))


def test_an_upload_asked_to_expire_says_when_and_bad_lifetimes_are_refused(start, files_dir):
    client = sdk(start())
    meta = client.beta.files.upload(file=("brief.txt", b"short-lived", "text/plain"), expires_in_seconds=3600)

    assert meta.expires_at == meta.created_at + timedelta(seconds=3600)
    assert client.beta.files.retrieve_metadata(meta.id).expires_at == meta.expires_at
    assert client.beta.files.list().data[0].expires_at == meta.expires_at
    assert (
        client.beta.files.upload(file=("kept.txt", b"kept", "text/plain")).expires_at is None
    )  # no expiry asked: none
    for bad in (3599, 7776001, 0):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.beta.files.upload(file=("bad.txt", b"x", "text/plain"), expires_in_seconds=bad)
        assert error_of(caught, 400, "invalid_request_error").startswith("expires_in_seconds:")
    assert len(stored(files_dir)) == 2  # nothing stored for the refused ones


def test_an_expired_file_is_a_file_expired_404_and_frees_its_space(start, files_dir, upstream):
    client = sdk(start(files={"max_total_bytes": 10}))
    meta = client.beta.files.upload(file=("brief.txt", b"0123456789", "text/plain"), expires_in_seconds=3600)
    expire_now(files_dir, meta.id)

    with pytest.raises(anthropic.types.FileExpiredError) as caught:  # the SDK's class for error_code file_expired
        client.messages.create(model=MODEL, max_tokens=5, messages=ask(document_file(meta.id)))
    assert "expired" in error_of(caught, 404, "not_found_error") and caught.value.error_code == "file_expired"
    assert not path_of(files_dir, meta.id).exists()  # its bytes are gone
    with pytest.raises(anthropic.types.FileExpiredError):  # and it stays expired
        client.messages.count_tokens(model=MODEL, messages=ask(document_file(meta.id)))
    assert upstream.requests == []
    assert client.beta.files.retrieve_metadata(meta.id).id == meta.id  # the metadata stays until deleted
    client.beta.files.upload(file=("new.txt", b"0123456789", "text/plain"))  # the expired file takes no quota


def test_passthrough_never_forwards_an_expired_file_id(start, native, files_dir):
    client = sdk(start(native=native))
    meta = client.beta.files.upload(file=("brief.txt", b"short-lived", "text/plain"), expires_in_seconds=3600)
    expire_now(files_dir, meta.id)

    with pytest.raises(anthropic.types.FileExpiredError):
        client.messages.create(model="claude-test", max_tokens=5, messages=ask(document_file(meta.id)))
    assert native.requests == []


@pytest.mark.parametrize(("sent", "kept"), [("../../etc/passwd", "passwd"), ("C:\\dir\\memo.txt", "memo.txt"),
                                           ("", "unnamed.png"), ("dir/", "unnamed.png")])  # fmt: skip
def test_an_uploads_filename_keeps_its_last_component_and_an_empty_one_is_unnamed(start, files_dir, sent, kept):
    gateway = start()
    form = (b'--XX\r\nContent-Disposition: form-data; name="file"; filename="' + sent.encode() + b'"\r\n'
            b"Content-Type: image/png\r\n\r\n" + PNG + b"\r\n--XX--\r\n")  # fmt: skip
    headers = {"x-api-key": KEY, "content-type": "multipart/form-data; boundary=XX"}
    uploaded = httpx.post(f"{gateway.url}/v1/files", content=form, headers=headers, timeout=5)

    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["filename"] == kept  # as the SDK documents it
    assert on_disk(files_dir) == sorted(
        [uploaded.json()["id"], uploaded.json()["id"] + ".json"]
    )  # never a path of the client's


def test_a_file_part_without_a_filename_is_an_unnamed_upload(start):
    """The TypeScript SDK sends a Blob, or toFile(bytes) with no name, as a part with a
    Content-Type and no filename at all: Anthropic names it `unnamed` (the SDK documents
    it). It was read as a plain form field: a 400 asking for the file."""
    gateway = start()
    form = (b'--XX\r\nContent-Disposition: form-data; name="file"\r\nContent-Type: image/png\r\n\r\n' + PNG +
            b'\r\n--XX\r\nContent-Disposition: form-data; name="expires_in_seconds"\r\n\r\n3600\r\n--XX--\r\n')  # fmt: skip
    headers = {"x-api-key": KEY, "content-type": "multipart/form-data; boundary=XX"}
    uploaded = httpx.post(f"{gateway.url}/v1/files", content=form, headers=headers, timeout=5)

    assert uploaded.status_code == 200, uploaded.text
    meta = uploaded.json()
    assert (meta["filename"], meta["mime_type"], meta["size_bytes"]) == ("unnamed.png", "image/png", len(PNG))
    assert "expires_at" in meta


def test_a_file_larger_than_a_multipart_part_limit_uploads_whole(start, files_dir):
    client = sdk(start())
    data = bytes(range(256)) * (6 * 1024)  # 1.5 MiB, past any per-field limit of the form parser
    meta = client.beta.files.upload(file=("big.bin", data, "application/octet-stream"))
    assert meta.size_bytes == len(data)
    assert path_of(files_dir, meta.id).read_bytes() == data


def test_downloading_an_upload_is_refused_as_on_anthropic_with_its_error_code(start):
    client = sdk(start())
    meta = client.beta.files.upload(file=("notes.txt", b"secret", "text/plain"))

    with pytest.raises(
        anthropic.types.FileNotDownloadableError
    ) as caught:  # the SDK's class for error_code file_not_downloadable
        client.beta.files.download(meta.id)
    assert "cannot be downloaded" in error_of(caught, 400, "invalid_request_error")
    assert caught.value.error_code == "file_not_downloadable"

    with pytest.raises(anthropic.NotFoundError) as caught:
        client.beta.files.download("file_011NoSuchFile")
    assert "file_011NoSuchFile" in error_of(caught, 404, "not_found_error")
    assert client.beta.files.retrieve_metadata(meta.id).id == meta.id  # refusing changed nothing


def test_delete_removes_the_file_everywhere(start, files_dir, upstream):
    client = sdk(start())
    kept = client.beta.files.upload(file=("kept.txt", b"kept", "text/plain"))
    gone = client.beta.files.upload(file=("gone.txt", b"gone", "text/plain"))

    deleted = client.beta.files.delete(gone.id)

    assert (deleted.id, deleted.type) == (gone.id, "file_deleted")
    assert stored(files_dir) == {kept.id}
    assert not path_of(files_dir, gone.id).exists()  # the content too, not only its metadata
    assert [f.id for f in client.beta.files.list().data] == [kept.id]
    for call in (client.beta.files.retrieve_metadata, client.beta.files.download, client.beta.files.delete):
        with pytest.raises(anthropic.NotFoundError) as caught:
            call(gone.id)
        assert gone.id in error_of(caught, 404, "not_found_error")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model=MODEL, max_tokens=10, messages=ask(document_file(gone.id)))
    assert upstream.requests == []


@pytest.mark.parametrize(
    "file_id", ["file_011NoSuchFile", "file_a.b", "notafile", "file_..", "file_%2e%2e", "file_" + "a" * 300]
)
def test_unknown_or_malformed_ids_are_404(start, file_id):
    gateway = start()
    client = sdk(gateway)
    client.beta.files.upload(file=("a.txt", b"a", "text/plain"))
    for call in (client.beta.files.retrieve_metadata, client.beta.files.download, client.beta.files.delete):
        with pytest.raises(anthropic.NotFoundError) as caught:
            call(file_id)
        error_of(caught, 404, "not_found_error")
    assert len(client.beta.files.list().data) == 1


def test_list_is_newest_first_and_pages_with_after_and_before_ids(start):
    gateway = start()
    client = sdk(gateway)
    assert client.beta.files.list().data == []  # nothing yet (the directory does not even exist)
    uploaded = [client.beta.files.upload(file=(f"f{i}.txt", f"file {i}".encode(), "text/plain")).id for i in range(5)]
    newest_first = uploaded[::-1]

    assert [f.id for f in client.beta.files.list().data] == newest_first
    assert [f.filename for f in client.beta.files.list().data] == [f"f{i}.txt" for i in range(4, -1, -1)]

    def page(**query: Any) -> dict[str, Any]:
        response = httpx.get(f"{gateway.url}/v1/files", params=query, headers={"x-api-key": KEY}, timeout=5)
        assert response.status_code == 200, response.text
        return response.json()

    first = page(limit=2)
    assert [f["id"] for f in first["data"]] == newest_first[:2]
    assert (first["has_more"], first["first_id"], first["last_id"]) == (True, newest_first[0], newest_first[1])
    second = page(limit=2, after_id=first["last_id"])
    assert [f["id"] for f in second["data"]] == newest_first[2:4] and second["has_more"] is True
    last = page(limit=2, after_id=second["last_id"])
    assert [f["id"] for f in last["data"]] == newest_first[4:] and last["has_more"] is False
    back = page(limit=2, before_id=newest_first[4])
    assert [f["id"] for f in back["data"]] == newest_first[2:4] and back["has_more"] is True
    assert page(limit=2, before_id=newest_first[1])["has_more"] is False
    assert page(limit=1000)["has_more"] is False

    by_sdk = client.beta.files.list(limit=2, extra_query={"after_id": newest_first[1]})
    assert [f.id for f in by_sdk.data] == newest_first[2:4]

    aliased = httpx.get(f"{gateway.url}/v1/v1/files", headers={"x-api-key": KEY}, timeout=5)  # a base URL ending in /v1
    assert [f["id"] for f in aliased.json()["data"]] == newest_first

    for query, field in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"), ({"after_id": "file_011Unknown"}, "after_id"),
                         ({"before_id": "file_011Unknown"}, "before_id")):  # fmt: skip
        message = raw_error(httpx.get(f"{gateway.url}/v1/files", params=query, timeout=5), 400, "invalid_request_error")
        assert message.startswith(field), message


def test_sdk_auto_pagination_lists_every_file(start):
    client = sdk(start())
    uploaded = [client.beta.files.upload(file=(f"f{i}.txt", b"x", "text/plain")).id for i in range(5)]
    assert [f.id for f in client.beta.files.list(limit=2)] == uploaded[::-1]


def test_a_scope_filter_lists_nothing_for_no_file_here_has_a_scope(start):
    client = sdk(start())
    uploaded = client.beta.files.upload(file=("f.txt", b"x", "text/plain")).id
    assert [f.id for f in client.beta.files.list(scope_id="sesn_011abc")] == []
    assert [f.id for f in client.beta.files.list()] == [uploaded]


def test_malformed_uploads_are_refused_and_store_nothing(start, files_dir):
    gateway = start()
    url = f"{gateway.url}/v1/files"

    message = raw_error(httpx.post(url, json={"file": "hello"}, timeout=5), 400, "invalid_request_error")
    assert "multipart/form-data" in message
    message = raw_error(
        httpx.post(url, files={"document": ("a.txt", b"hello", "text/plain")}, timeout=5), 400, "invalid_request_error"
    )
    assert "`file`" in message  # no part named file
    as_field = httpx.post(url, data={"file": "not a file"}, files={"other": ("o.txt", b"o", "text/plain")}, timeout=5)
    assert "`file`" in raw_error(as_field, 400, "invalid_request_error")  # a plain field, not a file
    message = raw_error(
        httpx.post(url, files={"file": ("empty.txt", b"", "text/plain")}, timeout=5), 400, "invalid_request_error"
    )
    assert "empty" in message
    for content_type in (
        "multipart/form-data",
        "multipart/form-data; boundary=xyz",
    ):  # no boundary; a body not in parts
        response = httpx.post(url, content=b"not multipart at all", headers={"content-type": content_type}, timeout=5)
        assert "multipart" in raw_error(response, 400, "invalid_request_error")
    two = [("file", ("a.txt", b"a", "text/plain")), ("file", ("b.txt", b"b", "text/plain"))]
    raw_error(httpx.post(url, files=two, timeout=5), 400, "invalid_request_error")

    assert stored(files_dir) == set()
    assert sdk(gateway).beta.files.list().data == []


def test_a_file_over_max_bytes_is_413_by_its_size_and_by_content_length(start, files_dir):
    gateway = start(files={"max_bytes": 1000})
    url = f"{gateway.url}/v1/files"
    client = sdk(gateway)

    exact = client.beta.files.upload(file=("exact.bin", b"e" * 1000, "application/octet-stream"))
    assert exact.size_bytes == 1000

    # One byte over: the body is within the multipart allowance, so the file's own size is checked.
    message = raw_error(
        httpx.post(url, files={"file": ("over.bin", b"o" * 1001, "text/plain")}, timeout=5), 413, "request_too_large"
    )
    assert "1000" in message
    # Far over: refused on the declared content-length, before the body is read.
    large = httpx.post(url, files={"file": ("large.bin", b"L" * 300_000, "text/plain")}, timeout=10)
    assert "1000" in raw_error(large, 413, "request_too_large")
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.beta.files.upload(file=("large.bin", b"L" * 300_000, "text/plain"))
    error_of(caught, 413, "request_too_large")

    # Without a content-length (chunked), the size read is what counts.
    boundary = "dragomanboundary"
    head = (f"--{boundary}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"chunked.bin\"\r\n"
            "content-type: application/octet-stream\r\n\r\n").encode()  # fmt: skip

    def chunks(size: int) -> Iterator[bytes]:
        yield head
        for _ in range(size // 500):
            yield b"c" * 500
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    chunked = httpx.post(url, content=chunks(5000), headers=headers, timeout=10)
    assert "content-length" not in chunked.request.headers
    raw_error(chunked, 413, "request_too_large")
    small = httpx.post(url, content=chunks(500), headers=headers, timeout=10)
    assert small.status_code == 200, small.text
    assert small.json()["size_bytes"] == 500

    assert stored(files_dir) == {exact.id, small.json()["id"]}


def test_uploads_past_max_total_bytes_are_refused_with_their_error_code_until_a_delete_makes_room(start, files_dir):
    gateway = start(files={"max_total_bytes": 1000})
    client = sdk(gateway)
    first = client.beta.files.upload(file=("first.bin", b"1" * 600, "application/octet-stream"))
    second = client.beta.files.upload(
        file=("second.bin", b"2" * 400, "application/octet-stream")
    )  # exactly at the limit

    with pytest.raises(
        anthropic.types.StorageQuotaExceededError
    ) as caught:  # the SDK's class for error_code storage_quota_exceeded
        client.beta.files.upload(file=("third.bin", b"3", "application/octet-stream"))  # one byte past it
    message = error_of(caught, 400, "invalid_request_error")
    assert caught.value.error_code == "storage_quota_exceeded"
    assert "files.max_total_bytes" in message and "1000 of 1000" in message, message
    assert caught.value.response.headers["request-id"] == caught.value.body["request_id"]
    assert stored(files_dir) == {first.id, second.id}  # no trace of the refused upload
    assert on_disk(files_dir) == sorted([first.id, f"{first.id}.json", second.id, f"{second.id}.json"])
    assert [f.id for f in client.beta.files.list().data] == [second.id, first.id]

    client.beta.files.delete(second.id)  # frees its 400 bytes at once
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.files.upload(file=("big.bin", b"b" * 401, "application/octet-stream"))
    assert "600 of 1000" in error_of(caught, 400, "invalid_request_error")
    third = client.beta.files.upload(file=("third.bin", b"3" * 400, "application/octet-stream"))
    assert stored(files_dir) == {first.id, third.id}
    assert path_of(files_dir, third.id).read_bytes() == b"3" * 400


def test_a_file_over_max_bytes_is_still_413_whatever_the_quota(start, files_dir):
    gateway = start(files={"max_bytes": 1000, "max_total_bytes": 500})
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk(gateway).beta.files.upload(file=("over.bin", b"o" * 1001, "application/octet-stream"))
    assert "1000" in error_of(caught, 413, "request_too_large")
    with pytest.raises(anthropic.BadRequestError) as caught:  # within max_bytes, past the quota
        sdk(gateway).beta.files.upload(file=("quota.bin", b"q" * 501, "application/octet-stream"))
    assert "files.max_total_bytes" in error_of(caught, 400, "invalid_request_error")
    assert stored(files_dir) == set()


def test_the_quota_is_per_key(start, files_dir):
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]}, files={"max_total_bytes": 100})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    full = a.beta.files.upload(file=("a.bin", b"a" * 100, "application/octet-stream"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        a.beta.files.upload(file=("more.bin", b"m", "application/octet-stream"))
    message = error_of(caught, 400, "invalid_request_error")
    assert "files.max_total_bytes" in message and "100 of 100" in message
    assert "sk-a" not in message and not any(c in message for c in ("owner", "digest"))  # nothing of the key

    of_b = b.beta.files.upload(file=("b.bin", b"b" * 100, "application/octet-stream"))  # A's files count only for A
    assert stored(files_dir) == {full.id, of_b.id}
    with pytest.raises(anthropic.BadRequestError):
        b.beta.files.upload(file=("more.bin", b"m", "application/octet-stream"))


def test_uploads_past_max_files_are_refused_per_key_until_a_delete_makes_room(start, files_dir):
    """Tiny files cost inodes and disk blocks that max_total_bytes does not count."""
    gateway = start(server={"api_keys": ["sk-a", "sk-b"]}, files={"max_files": 2})
    a, b = sdk(gateway, "sk-a"), sdk(gateway, "sk-b")
    first, second = (a.beta.files.upload(file=(f"{n}.txt", b"x", "text/plain")) for n in (1, 2))
    with pytest.raises(anthropic.types.StorageQuotaExceededError) as caught:
        a.beta.files.upload(file=("3.txt", b"x", "text/plain"))
    message = error_of(caught, 400, "invalid_request_error")
    assert caught.value.error_code == "storage_quota_exceeded"
    assert "files.max_files" in message and "2 of 2 files" in message, message
    assert "sk-a" not in message and not any(c in message for c in ("owner", "digest"))  # nothing of the key
    assert stored(files_dir) == {first.id, second.id}  # no trace of the refused upload

    of_b = b.beta.files.upload(file=("b.txt", b"x", "text/plain"))  # A's files count only for A
    a.beta.files.delete(first.id)
    third = a.beta.files.upload(file=("3.txt", b"x", "text/plain"))
    assert stored(files_dir) == {second.id, third.id, of_b.id}
