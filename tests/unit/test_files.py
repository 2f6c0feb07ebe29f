"""FileStore: storage in a directory, ids that cannot name a path outside it, and file
sources replaced by the file's content in a request body."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest

from dragoman.config import FilesConfig
from dragoman.errors import InvalidRequest, NotFound
from dragoman.files import FileStore, names_a_file


def store(tmp_path: Path) -> FileStore:
    return FileStore(FilesConfig(dir=str(tmp_path / "files")))


def body(*blocks: dict) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": list(blocks)}]}).encode()


def test_saved_files_are_listed_newest_first_and_deleted(tmp_path: Path) -> None:
    files = store(tmp_path)

    async def main() -> None:
        first = await files.save("a.txt", "text/plain", b"one")
        second = await files.save("b.txt", "text/plain", b"two")
        assert [f["id"] for f in (await files.page({}))["data"]] == [second.id, first.id]
        assert files.metadata(first.id).size_bytes == 3
        assert (await files.content(second.id))[1] == b"two"
        files.delete(first.id)
        with pytest.raises(NotFound):
            files.metadata(first.id)
        assert [f["id"] for f in (await files.page({}))["data"]] == [second.id]
        assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [second.id, second.id + ".json"]  # no temporaries left

    asyncio.run(main())


@pytest.mark.parametrize("file_id", ["../secret", "file_../../etc/passwd", "file_a/b", "notafile", "file_x.json"])
def test_an_id_never_names_a_path_outside_the_directory(tmp_path: Path, file_id: str) -> None:
    (tmp_path / "secret.json").write_text("{}")
    with pytest.raises(NotFound):
        store(tmp_path).metadata(file_id)


def test_an_empty_upload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="empty"):
        asyncio.run(store(tmp_path).save("a.txt", "text/plain", b""))


def test_file_sources_are_replaced_by_the_content(tmp_path: Path) -> None:
    files = store(tmp_path)
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16

    async def main() -> dict:
        image = await files.save("dot.png", "image/png", png)
        text = await files.save("note.txt", "text/plain; charset=utf-8", "naïve note".encode())
        pdf = await files.save("doc.pdf", "application/pdf", b"%PDF-1.4 tiny")
        raw = body(
            {"type": "image", "source": {"type": "file", "file_id": image.id}},
            {"type": "document", "source": {"type": "file", "file_id": text.id}, "title": "kept"},
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {"type": "file", "file_id": pdf.id}}]},
            {"type": "text", "text": "file_id is just text here"},
        )
        assert names_a_file(raw)
        return json.loads(await files.resolve(raw, 10**9))

    content = asyncio.run(main())["messages"][0]["content"]
    assert content[0]["source"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    assert content[1]["source"] == {"type": "text", "media_type": "text/plain", "data": "naïve note"} and content[1]["title"] == "kept"
    assert content[2]["content"][0]["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(content[2]["content"][0]["source"]["data"]) == b"%PDF-1.4 tiny"
    assert content[3] == {"type": "text", "text": "file_id is just text here"}


def test_a_body_without_file_sources_is_returned_as_is(tmp_path: Path) -> None:
    raw = body({"type": "text", "text": "mentions file_id"})
    assert asyncio.run(store(tmp_path).resolve(raw, 10**9)) is raw


@pytest.mark.parametrize(("block", "error", "fragment"), [
    ({"type": "image", "source": {"type": "file", "file_id": "TEXT"}}, InvalidRequest, "is text/plain, not an image"),
    ({"type": "document", "source": {"type": "file", "file_id": "BIN"}}, InvalidRequest, "a document must be a PDF or text"),
    ({"type": "document", "source": {"type": "file", "file_id": 7}}, InvalidRequest, "messages.0.content.0.source.file_id: a string"),
])  # fmt: skip
def test_a_file_source_that_cannot_be_used_names_the_field(tmp_path: Path, block: dict, error: type, fragment: str) -> None:
    files = store(tmp_path)

    async def main() -> None:
        text = await files.save("a.txt", "text/plain", b"x")
        binary = await files.save("a.bin", "application/octet-stream", b"x")
        source = block["source"]
        source["file_id"] = {"TEXT": text.id, "BIN": binary.id}.get(source["file_id"], source["file_id"])
        await files.resolve(body(block), 10**9)

    with pytest.raises(error, match=fragment):
        asyncio.run(main())


def test_requests_are_scanned_only_once_a_file_exists(tmp_path: Path) -> None:
    """Another process's upload to the same directory is seen at the next request."""
    mine, other = store(tmp_path), store(tmp_path)
    assert not mine.in_use() and not other.in_use()  # no directory yet
    asyncio.run(other.save("a.txt", "text/plain", b"x"))
    assert other.in_use() and mine.in_use()


def test_a_file_id_the_gateway_does_not_have_is_left_as_sent(tmp_path: Path) -> None:
    """The translator answers it with a 404; passthrough forwards it (the upstream may know it)."""
    raw = body({"type": "image", "source": {"type": "file", "file_id": "file_011Elsewhere"}})
    assert asyncio.run(store(tmp_path).resolve(raw, 10**9)) is raw


def test_a_small_request_naming_a_large_file_many_times_is_refused_not_grown(tmp_path: Path) -> None:
    from dragoman.errors import RequestTooLarge

    files = store(tmp_path)

    async def main() -> None:
        pdf = await files.save("big.pdf", "application/pdf", b"%PDF-" + b"x" * 100_000)
        named = [{"type": "document", "source": {"type": "file", "file_id": pdf.id}}] * 8  # ~1 MB once filled in
        assert len(await files.resolve(body(*named[:2]), 1_000_000)) < 1_000_000  # two fit
        with pytest.raises(RequestTooLarge, match=r"messages\.0\.content\.\d\.source\.file_id"):
            await files.resolve(body(*named), 1_000_000)

    asyncio.run(main())


def test_a_deeply_nested_body_is_left_to_the_request_decoder(tmp_path: Path) -> None:
    raw = b'{"file_id": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert asyncio.run(store(tmp_path).resolve(raw, 10**9)) is raw  # the usual 400 comes from decoding it, not a 500 here


def test_foreign_or_corrupt_metadata_is_not_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "files"
    directory.mkdir()
    (directory / "file_foreign.json").write_text("{not json")
    files = store(tmp_path)
    with pytest.raises(NotFound):
        files.metadata("file_foreign")
    assert asyncio.run(files.page({}))["data"] == []


def test_a_filename_keeps_only_its_last_component(tmp_path: Path) -> None:
    meta = asyncio.run(store(tmp_path).save("../../etc/passwd", "text/plain", b"x"))
    assert meta.filename == "passwd"
    assert asyncio.run(store(tmp_path).save("C:\\\\Users\\\\me\\\\notes.txt", "text/plain", b"x")).filename == "notes.txt"


def test_uploads_are_private_to_the_gateway_user(tmp_path: Path) -> None:
    files = store(tmp_path)
    meta = asyncio.run(files.save("a.txt", "text/plain", b"secret"))
    assert (tmp_path / "files").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "files" / meta.id).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "files" / (meta.id + ".json")).stat().st_mode & 0o777 == 0o600
