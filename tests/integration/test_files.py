"""The Files API over a real socket, driven by the official SDK (`client.beta.files`):
upload (multipart), list (newest first, paginated), retrieve metadata, download (refused,
as on Anthropic), delete; malformed and oversized uploads (raw httpx); image and document
blocks whose source is `{"type": "file"}` on the translating path (an `image_url` data URL,
a PDF's text, a text file's text), inside tool results, in count_tokens and in batches, and
on the passthrough path (the resolved content is forwarded, never the file_id); files kept
in `files.dir` across a restart and shared by two gateways; the gateway's API keys on every
files route, and each key seeing only its own files (unless `share_between_keys`). Every gateway here keeps its files under pytest's tmp_path.

A file id the gateway does not have is a 404 on the translating path and is forwarded as sent
on the passthrough path (an Anthropic upstream may know it), whether or not any file exists."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.core.owners import SALT_FILE
from tests.support.envelopes import error_of, raw_error
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fakes import FakeUpstream, completion
from tests.support.samples import pdf_bytes
from tests.support.servers import GatewayServer

KEY = "test-key"
MODEL = "eyes"  # a vision model in front of the fake upstream's test-model
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)  # a 1x1 PNG
GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")  # 1x1 GIF
NATIVE_UPSTREAM = {"protocol": "anthropic", "api_key": "upstream-secret", "max_retries": 0}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_file(file_id: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "file", "file_id": file_id}}


def document_file(file_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "file", "file_id": file_id}, **extra}


def ask(*blocks: dict[str, Any], text: str = "What is this?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": text}]}]


def stored(files_dir: Path) -> set[str]:
    """The file ids whose metadata is in the directory (in an owner's directory, or flat)."""
    return {path.stem for path in files_dir.rglob("file_*.json")}


def on_disk(files_dir: Path) -> list[str]:
    """The names of every file in the directory, owners' directories included (not the gateway's
    owner salt, which it keeps there)."""
    return sorted(path.name for path in files_dir.rglob("*") if path.is_file() and path.name != SALT_FILE)


def path_of(files_dir: Path, name: str) -> Path:
    """Where a stored file's content (or, with .json, metadata) is: in its owner's directory."""
    found = list(files_dir.glob(f"*/{name}"))
    assert len(found) <= 1, found
    return found[0] if found else files_dir / "nowhere" / name


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    return tmp_path / "files"


@pytest.fixture
def start(
    upstream: FakeUpstream, files_dir: Path, gateway_from: Callable[[dict], GatewayServer]
) -> Callable[..., GatewayServer]:
    """`start(files={...}, server={...}, native=FakeAnthropic, directory=...)`: a gateway whose
    files are kept under tmp_path, in front of the fake upstream (model `eyes`, with vision) or,
    given `native`, of the fake Anthropic upstream (model `claude-test`)."""

    def run(*, files: dict | None = None, server: dict | None = None, native: FakeAnthropic | None = None,
            directory: Path | None = None) -> GatewayServer:  # fmt: skip
        data: dict[str, Any] = {"server": server or {}, "files": {"dir": str(directory or files_dir), **(files or {})}}
        if native is None:
            data["upstreams"] = {"default": {"url": upstream.url, "max_retries": 0}}
            data["models"] = [{"name": MODEL, "upstream": "default", "upstream_model": "test-model", "vision": True}]
        else:
            data["upstreams"] = {"native": {**NATIVE_UPSTREAM, "url": native.url + "/v1"}}
            data["models"] = [{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}]
        assert data["files"]["dir"], "never the real home directory"
        return gateway_from(data)

    return run


def sdk(gateway: GatewayServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=10)


# -- upload, retrieve, download, delete ---------------------------------------------------------


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


# -- list ---------------------------------------------------------------------------------------


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


# -- malformed and oversized uploads -------------------------------------------------------------


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


# -- the storage quota ---------------------------------------------------------------------------


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


# -- file sources in /v1/messages: the translating path -----------------------------------------


@pytest.mark.parametrize(
    ("mime", "data", "sent_as"),
    [
        ("image/png", PNG, "image/png"),
        ("image/gif", GIF, "image/gif"),
        ("image/jpeg", PNG, "image/png"),
        ("image/webp", PNG, "image/png"),
    ],
    ids=["png", "gif", "png-uploaded-as-jpeg", "png-uploaded-as-webp"],
)
def test_an_image_file_reaches_the_model_as_a_data_url(start, upstream, mime, data, sent_as):
    client = sdk(start())
    meta = client.beta.files.upload(file=("picture", data, mime))
    upstream.json_reply(completion("a dot"))

    reply = client.messages.create(model=MODEL, max_tokens=20, messages=ask(image_file(meta.id)))

    assert reply.content[0].text == "a dot"
    parts = upstream.requests[0]["messages"][0]["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": f"data:{sent_as};base64,{b64(data)}"}}
    assert parts[1] == {"type": "text", "text": "What is this?"}
    assert meta.id not in json.dumps(upstream.requests[0])


def test_a_pdf_file_reaches_the_model_as_its_text(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("report.pdf", pdf_bytes("Quarterly revenue rose"), "application/pdf"))
    upstream.json_reply(completion("It rose."))

    client.messages.create(
        model=MODEL, max_tokens=20, messages=ask(document_file(meta.id, title="Report", context="From finance"))
    )

    sent = json.dumps(upstream.requests[0]["messages"][0]["content"])
    assert "Quarterly revenue rose" in sent and 'title=\\"Report\\"' in sent and "From finance" in sent
    assert meta.id not in json.dumps(upstream.requests[0])


@pytest.mark.parametrize("mime", ["text/plain", "text/markdown; charset=utf-8", "text/csv", "application/json"])
def test_a_text_file_reaches_the_model_as_its_text(start, upstream, mime):
    client = sdk(start())
    content = "The launch code is 1234. Ünïcode kept."
    meta = client.beta.files.upload(file=("memo", content.encode(), mime))
    upstream.json_reply(completion("1234"))

    client.messages.create(
        model=MODEL, max_tokens=20, messages=ask(document_file(meta.id, title="Memo"), text="The code?")
    )

    sent = upstream.requests[0]["messages"][0]["content"]
    text = sent if isinstance(sent, str) else "\n".join(p["text"] for p in sent if p["type"] == "text")
    assert content in text and 'title="Memo"' in text and "The code?" in text


@pytest.mark.parametrize("charset", ["iso-8859-1", "windows-1252", '"utf-16"'])
def test_a_text_file_is_read_in_the_charset_it_was_uploaded_with(start, upstream, charset):
    client = sdk(start())
    content = "Café, naïve, Ünïcode"
    meta = client.beta.files.upload(
        file=("memo.txt", content.encode(charset.strip('"')), f"text/plain; charset={charset}")
    )

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id)))

    assert content in json.dumps(upstream.requests[0]["messages"][0]["content"], ensure_ascii=False)


@pytest.mark.parametrize("charset", ["base64", "zlib", "idna", "no-such-charset"])
def test_a_declared_charset_that_is_no_text_encoding_reads_as_utf8(start, upstream, charset):
    client = sdk(start())
    content = "Café note"
    meta = client.beta.files.upload(file=("memo.txt", content.encode(), f"text/plain; charset={charset}"))

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id)))  # not a 500

    assert content in json.dumps(upstream.requests[0]["messages"][0]["content"], ensure_ascii=False)


def test_the_sdks_beta_messages_with_the_files_beta(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("dot.png", PNG, "image/png"), betas=["files-api-2025-04-14"])
    upstream.json_reply(completion("a dot"))

    reply = client.beta.messages.create(
        model=MODEL, max_tokens=20, messages=ask(image_file(meta.id)), betas=["files-api-2025-04-14"]
    )

    assert reply.content[0].text == "a dot"
    assert upstream.requests[0]["messages"][0]["content"][0]["image_url"]["url"] == f"data:image/png;base64,{b64(PNG)}"


def test_a_streamed_request_gets_the_file_too(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("memo.txt", b"streamed memo text", "text/plain"))
    with client.messages.stream(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id))) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello!"
    assert "streamed memo text" in json.dumps(upstream.requests[0]["messages"])


def test_file_sources_in_tool_results_are_resolved(start, upstream):
    client = sdk(start())
    shot = client.beta.files.upload(file=("shot.png", PNG, "image/png"))
    log = client.beta.files.upload(file=("log.txt", b"disk almost full", "text/plain"))
    upstream.json_reply(completion("I see"))
    tools = [
        {
            "name": "screenshot",
            "description": "Take a screenshot.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    turns = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": [
            {"type": "text", "text": "captured"}, image_file(shot.id), document_file(log.id)]}]},
    ]  # fmt: skip

    client.messages.create(model=MODEL, max_tokens=20, tools=tools, messages=turns)

    sent = upstream.requests[0]["messages"]
    assert sent[2]["role"] == "tool" and sent[2]["tool_call_id"] == "toolu_shot"
    assert "disk almost full" in json.dumps(sent)
    images = [p for m in sent if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image_url"]
    assert images == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}}]
    assert shot.id not in json.dumps(sent) and log.id not in json.dumps(sent)

    turns[2]["content"][0]["content"][1] = image_file("file_011Missing")
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model=MODEL, max_tokens=20, tools=tools, messages=turns)
    assert "messages.2.content.0.content.1.source.file_id" in error_of(caught, 404, "not_found_error")
    assert len(upstream.requests) == 1


def test_bad_file_sources_are_refused_naming_the_field(start, upstream):
    client = sdk(start())
    text = client.beta.files.upload(file=("memo.txt", b"just text", "text/plain"))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    binary = client.beta.files.upload(file=("blob.bin", b"\x00\x01", "application/octet-stream"))
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]

    def refused(block: dict[str, Any], status: int, error_type: str) -> str:
        messages = [*history, {"role": "user", "content": [{"type": "text", "text": "look"}, block]}]
        error: type[anthropic.APIStatusError] = anthropic.NotFoundError if status == 404 else anthropic.BadRequestError
        with pytest.raises(error) as caught:
            client.messages.create(model=MODEL, max_tokens=10, messages=messages)
        return error_of(caught, status, error_type)

    field = "messages.2.content.1.source.file_id"
    message = refused(image_file("file_011Missing"), 404, "not_found_error")
    assert message.startswith(field) and "file_011Missing" in message
    assert refused(document_file("file_011Missing"), 404, "not_found_error").startswith(field)
    message = refused(image_file(text.id), 400, "invalid_request_error")
    assert message.startswith(field) and "text/plain" in message
    assert refused(document_file(image.id), 400, "invalid_request_error").startswith(field)
    assert refused(document_file(binary.id), 400, "invalid_request_error").startswith(field)
    bad_id = {"type": "document", "source": {"type": "file", "file_id": 42}}
    assert refused(bad_id, 400, "invalid_request_error").startswith(field)
    assert upstream.requests == []

    broken = httpx.post(f"{client.base_url}".rstrip("/") + "/v1/messages", headers={"x-api-key": KEY}, timeout=5,
                        content=b'{"model": "eyes", "messages": [{"role": "user", "content": [{"source": {"file_id": ')  # fmt: skip
    raw_error(broken, 400, "invalid_request_error")  # malformed JSON naming a file: the usual 400, not a 500
    assert upstream.requests == []

    upstream.json_reply(completion("fine"))  # the same files, each in its place, pass
    client.messages.create(model=MODEL, max_tokens=10, messages=ask(image_file(image.id), document_file(text.id)))
    assert len(upstream.requests) == 1
    mention = 'a "file_id": "file_011Missing" in plain text is only text'
    client.messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": mention}], extra_body={"temperature": 0.25}
    )
    assert upstream.requests[-1]["messages"][-1]["content"] == mention and upstream.requests[-1]["temperature"] == 0.25


def test_count_tokens_counts_the_files_content(start, upstream):
    client = sdk(start())
    short = client.beta.files.upload(file=("short.txt", b"tiny", "text/plain"))
    long = client.beta.files.upload(file=("long.txt", b"lorem ipsum dolor " * 200, "text/plain"))

    small = client.messages.count_tokens(model=MODEL, messages=ask(document_file(short.id)))
    big = client.messages.count_tokens(model=MODEL, messages=ask(document_file(long.id)))

    assert big.input_tokens > small.input_tokens + 400  # the file's 600 words are counted
    assert upstream.requests == []  # counting never runs the model
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model=MODEL, messages=ask(image_file("file_011Missing")))
    assert "messages.0.content.0.source.file_id" in error_of(caught, 404, "not_found_error")


# -- uploads of raw bytes, without a name or a type: used as what their bytes show -----------------

RAW_TEXT = "Raw notes: the launch code is 1234. Ünïcode kept.\n"


def test_raw_byte_uploads_reach_the_model_as_what_their_bytes_show(start, upstream):
    """`files.upload(file=bytes)` sends no filename and `application/octet-stream`: a PDF, a
    text or an image uploaded so is used as it would be had it been typed. Its metadata says
    what was uploaded, as on Anthropic."""
    client = sdk(start())
    pdf = client.beta.files.upload(file=pdf_bytes("Sniffed revenue rose"))
    text = client.beta.files.upload(file=RAW_TEXT.encode("utf-16"))  # with its byte order mark
    jsonl = client.beta.files.upload(file=("rows.jsonl", b'{"code": 1234}\n'))  # an extension mimetypes does not know
    image = client.beta.files.upload(file=PNG)
    assert (pdf.filename, pdf.mime_type) == ("unnamed", "application/octet-stream")
    assert (jsonl.filename, jsonl.mime_type) == ("rows.jsonl", "application/octet-stream")
    upstream.json_reply(completion("read"))

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(pdf.id, title="Report"), document_file(text.id),
                                                                    document_file(jsonl.id), image_file(image.id)))  # fmt: skip

    parts = upstream.requests[0]["messages"][0]["content"]
    sent = "\n".join(part["text"] for part in parts if part["type"] == "text")
    assert "Sniffed revenue rose" in sent and 'title="Report"' in sent
    assert RAW_TEXT.strip() in sent and '{"code": 1234}' in sent
    assert {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}} in parts
    assert "file_" not in json.dumps(upstream.requests[0])


def test_passthrough_gets_raw_byte_uploads_as_it_gets_typed_ones(start, native):
    client = sdk(start(native=native))
    pdf, jpeg = pdf_bytes("Native raw report"), b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(32)
    blocks = []
    for data, typed, block in [(pdf, "application/pdf", document_file), (RAW_TEXT.encode(), "text/plain", document_file),
                               (PNG, "image/png", image_file), (jpeg, "image/jpeg", image_file), (GIF, "image/gif", image_file)]:  # fmt: skip
        raw = client.beta.files.upload(file=data)
        named = client.beta.files.upload(file=("named", data, typed))
        blocks += [block(raw.id), block(named.id)]

    client.messages.create(model="claude-test", max_tokens=10, messages=ask(*blocks))

    sent = native.requests[0][1]["messages"][0]["content"]
    for raw_block, typed_block in zip(sent[0:-1:2], sent[1:-1:2], strict=True):
        assert raw_block == typed_block  # the upstream cannot tell them apart
    assert [block["source"].get("media_type") for block in sent[0:-1:2]] == ["application/pdf", "text/plain", "image/png",
                                                                                "image/jpeg", "image/gif"]  # fmt: skip
    assert sent[2]["source"] == {"type": "text", "media_type": "text/plain", "data": RAW_TEXT}


def test_raw_bytes_that_show_no_usable_type_are_still_refused(start, upstream):
    client = sdk(start())
    archive = client.beta.files.upload(file=b"PK\x03\x04\x14\x00\x00\x00\x08\x00")
    text = client.beta.files.upload(file=RAW_TEXT.encode())
    for block, words in [(document_file(archive.id), "application/octet-stream; a document must be a PDF or text"),
                         (image_file(text.id), "is text/plain, not an image")]:  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=MODEL, max_tokens=10, messages=ask(block))
        message = error_of(caught, 400, "invalid_request_error")
        assert message.startswith("messages.0.content.0.source.file_id") and words in message
    assert upstream.requests == []


# -- the passthrough path -------------------------------------------------------------------------


def test_passthrough_upstream_gets_the_files_content_never_the_file_id(start, native):
    client = sdk(start(native=native))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    pdf = pdf_bytes("Native report")
    report = client.beta.files.upload(file=("report.pdf", pdf, "application/pdf"))
    memo = client.beta.files.upload(file=("memo.txt", "a memo, ü".encode(), "text/plain; charset=utf-8"))

    reply = client.messages.create(
        model="claude-test", max_tokens=10,
        messages=ask(image_file(image.id), document_file(report.id, title="Report", citations={"enabled": True}), document_file(memo.id)),
        extra_body={"some_future_field": {"x": 1}},
    )  # fmt: skip

    assert reply.content[0].text == "Hi" and reply.model == "claude-test"
    path, body, headers = native.requests[0]
    assert path == "/v1/messages" and body["model"] == "native-model"
    assert body["some_future_field"] == {"x": 1}
    blocks = body["messages"][0]["content"]
    assert blocks[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    assert blocks[1] == {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf)},
                         "title": "Report", "citations": {"enabled": True}}  # fmt: skip
    assert blocks[2] == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "a memo, ü"},
    }
    assert blocks[3] == {"type": "text", "text": "What is this?"}
    assert "file_id" not in json.dumps(body)
    assert headers["x-api-key"] == "upstream-secret"


def test_passthrough_gets_the_content_of_a_file_inside_a_content_document(start, native):
    client = sdk(start(native=native))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    inner = [{"type": "text", "text": "a figure"}, image_file(image.id)]
    in_tool_result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "document", "source": {"type": "content", "content": inner}}],
    }
    messages = [{"role": "user", "content": "look"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "see", "input": {}}]},
                {"role": "user", "content": [in_tool_result, {"type": "document", "source": {"type": "content", "content": inner}}]}]  # fmt: skip

    client.messages.create(model="claude-test", max_tokens=10, messages=messages)

    _, body, _ = native.requests[0]
    resolved = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    assert body["messages"][2]["content"][0]["content"][0]["source"]["content"][1] == resolved
    assert body["messages"][2]["content"][1]["source"]["content"][1] == resolved
    assert "file_id" not in json.dumps(body)  # an Anthropic upstream does not know the gateway's files


def test_passthrough_count_tokens_and_unknown_files(start, native):
    client = sdk(start(native=native))
    memo = client.beta.files.upload(file=("memo.txt", b"count these words", "text/plain"))

    client.messages.count_tokens(model="claude-test", messages=ask(document_file(memo.id)))

    path, body, _ = native.requests[0]
    assert path == "/v1/messages/count_tokens"
    assert body["messages"][0]["content"][0]["source"] == {
        "type": "text",
        "media_type": "text/plain",
        "data": "count these words",
    }
    client.messages.create(model="claude-test", max_tokens=10, messages=ask(image_file("file_011Missing")))
    assert native.requests[1][1]["messages"][0]["content"][0]["source"] == {
        "type": "file",
        "file_id": "file_011Missing",
    }  # not ours: forwarded as sent


# -- batches ----------------------------------------------------------------------------------------


def test_a_batch_request_naming_a_file_gets_its_content(start, upstream):
    client = sdk(start())
    memo = client.beta.files.upload(file=("memo.txt", b"the batch memo", "text/plain"))
    upstream.responder = lambda body: None  # every request: completion("Hello!")

    def params(*blocks: dict[str, Any]) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": 10, "messages": ask(*blocks)}

    created = client.messages.batches.create(requests=[
        {"custom_id": "with-file", "params": params(document_file(memo.id))},
        {"custom_id": "missing", "params": params(image_file("file_011Missing"))},
    ])  # fmt: skip
    deadline = time.monotonic() + 10
    while (batch := client.messages.batches.retrieve(created.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.02)

    results = {line.custom_id: line.result for line in client.messages.batches.results(created.id)}
    assert results["with-file"].type == "succeeded"
    assert results["missing"].type == "errored"
    assert results["missing"].error.error.type == "not_found_error"
    assert "messages.0.content.0.source.file_id" in results["missing"].error.error.message
    assert len(upstream.requests) == 1
    assert "the batch memo" in json.dumps(upstream.requests[0]["messages"])


# -- persistence and sharing ------------------------------------------------------------------------


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


# -- API keys -----------------------------------------------------------------------------------------


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


# -- each key's own files ----------------------------------------------------------------------------


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
    deadline = (
        time.monotonic() + 10
    )  # moved into the owner's directory at start-up, in the background; served meanwhile
    while (files_dir / "file_011Old.json").exists():
        assert [f.id for f in client.beta.files.list().data] == ["file_011Old"]
        assert time.monotonic() < deadline
        time.sleep(0.02)
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


# -- a store with no files yet --------------------------------------------------------------------


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
