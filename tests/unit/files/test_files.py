"""FileStore: storage in a directory, ids that cannot name a path outside it, and file
sources replaced by the file's content in a request body."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from dragoman.core.config import FilesConfig
from dragoman.core.errors import InvalidRequest, NotFound
from dragoman.files.sources import names_a_file
from dragoman.files.store import FileStore
from dragoman.server.file_endpoints import _expires_in


def store(tmp_path: Path) -> FileStore:
    return FileStore(FilesConfig(dir=str(tmp_path / "files")))


def body(*blocks: dict) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": list(blocks)}]}).encode()


async def content_of(files: FileStore, file_id: str, *, owner: str) -> bytes | None:
    """A text file's content, as a request naming it in a document gets it (files cannot be
    downloaded); None if the request is left as sent (an unknown id, or another owner's)."""
    raw = body({"type": "document", "source": {"type": "file", "file_id": file_id}})
    source = json.loads(await files.resolve(raw, 10**9, owner=owner))["messages"][0]["content"][0]["source"]
    return source["data"].encode() if source["type"] == "text" else None


def test_saved_files_are_listed_newest_first_and_deleted(tmp_path: Path) -> None:
    files = store(tmp_path)

    async def main() -> None:
        first = await files.save("a.txt", "text/plain", b"one", owner="")
        second = await files.save("b.txt", "text/plain", b"two", owner="")
        assert [f["id"] for f in (await files.page({}, owner=""))["data"]] == [second.id, first.id]
        assert files.metadata(first.id, owner="").size_bytes == 3
        assert await content_of(files, second.id, owner="") == b"two"
        files.delete(first.id, owner="")
        with pytest.raises(NotFound):
            files.metadata(first.id, owner="")
        assert [f["id"] for f in (await files.page({}, owner=""))["data"]] == [second.id]
        assert [p.name for p in (tmp_path / "files").iterdir()] == [
            "shared"
        ]  # the owner "": no keys, or keys that share
        assert sorted(p.name for p in (tmp_path / "files" / "shared").iterdir()) == [
            second.id,
            second.id + ".json",
        ]  # no temporaries left

    asyncio.run(main())


@pytest.mark.parametrize("file_id", ["../secret", "file_../../etc/passwd", "file_a/b", "notafile", "file_x.json"])
def test_an_id_never_names_a_path_outside_the_directory(tmp_path: Path, file_id: str) -> None:
    (tmp_path / "secret.json").write_text("{}")
    with pytest.raises(NotFound):
        store(tmp_path).metadata(file_id, owner="")


def test_an_empty_upload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="empty"):
        asyncio.run(store(tmp_path).save("a.txt", "text/plain", b"", owner=""))


def test_file_sources_are_replaced_by_the_content(tmp_path: Path) -> None:
    files = store(tmp_path)
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16

    async def main() -> dict:
        image = await files.save("dot.png", "image/png", png, owner="")
        text = await files.save("note.txt", "text/plain; charset=utf-8", "naïve note".encode(), owner="")
        pdf = await files.save("doc.pdf", "application/pdf", b"%PDF-1.4 tiny", owner="")
        raw = body(
            {"type": "image", "source": {"type": "file", "file_id": image.id}},
            {"type": "document", "source": {"type": "file", "file_id": text.id}, "title": "kept"},
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "document", "source": {"type": "file", "file_id": pdf.id}}],
            },
            {"type": "text", "text": "file_id is just text here"},
        )
        assert names_a_file(raw)
        return json.loads(await files.resolve(raw, 10**9, owner=""))

    content = asyncio.run(main())["messages"][0]["content"]
    assert content[0]["source"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    assert (
        content[1]["source"] == {"type": "text", "media_type": "text/plain", "data": "naïve note"}
        and content[1]["title"] == "kept"
    )
    assert content[2]["content"][0]["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(content[2]["content"][0]["source"]["data"]) == b"%PDF-1.4 tiny"
    assert content[3] == {"type": "text", "text": "file_id is just text here"}


def test_a_body_without_file_sources_is_returned_as_is(tmp_path: Path) -> None:
    raw = body({"type": "text", "text": "mentions file_id"})
    assert asyncio.run(store(tmp_path).resolve(raw, 10**9, owner="")) is raw


@pytest.mark.parametrize(("block", "error", "fragment"), [
    ({"type": "image", "source": {"type": "file", "file_id": "TEXT"}}, InvalidRequest, "is text/plain, not an image"),
    ({"type": "document", "source": {"type": "file", "file_id": "BIN"}}, InvalidRequest, "a document must be a PDF or text"),
    ({"type": "document", "source": {"type": "file", "file_id": 7}}, InvalidRequest, "messages.0.content.0.source.file_id: a string"),
])  # fmt: skip
def test_a_file_source_that_cannot_be_used_names_the_field(
    tmp_path: Path, block: dict, error: type, fragment: str
) -> None:
    files = store(tmp_path)

    async def main() -> None:
        text = await files.save("a.txt", "text/plain", b"x", owner="")
        binary = await files.save("a.bin", "application/octet-stream", b"\x00\x01", owner="")  # bytes that show no type
        source = block["source"]
        source["file_id"] = {"TEXT": text.id, "BIN": binary.id}.get(source["file_id"], source["file_id"])
        await files.resolve(body(block), 10**9, owner="")

    with pytest.raises(error, match=fragment):
        asyncio.run(main())


def test_requests_are_scanned_only_once_a_file_exists(tmp_path: Path) -> None:
    """Another process's upload to the same directory is seen at the next request."""
    mine, other = store(tmp_path), store(tmp_path)
    assert not mine.in_use() and not other.in_use()  # no directory yet
    asyncio.run(other.save("a.txt", "text/plain", b"x", owner=""))
    assert other.in_use() and mine.in_use()


def test_an_owner_directory_made_in_the_tick_of_a_look_is_still_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look into the empty directory, then a new owner's upload within the same mtime tick
    (the mtime stays as it was, and no later change moves it): the upload is still seen."""
    files, other = store(tmp_path), store(tmp_path)
    root = tmp_path / "files"
    root.mkdir()
    tick = 1_700_000_000_000_000_000
    os.utime(root, ns=(tick, tick))
    monkeypatch.setattr(
        "dragoman.files.store.time", SimpleNamespace(time_ns=lambda: tick + 1_000_000)
    )  # the look, 1 ms later
    assert not files.in_use()
    asyncio.run(other.save("a.txt", "text/plain", b"x", owner=A))
    os.utime(root, ns=(tick, tick))  # made in that same tick
    assert files.in_use()


def test_an_empty_directory_is_looked_into_once_its_mtime_is_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path stays one stat: an old mtime is trusted, and a change to it is seen."""
    files = store(tmp_path)
    root = tmp_path / "files"
    root.mkdir()
    tick = 1_700_000_000_000_000_000
    os.utime(root, ns=(tick, tick))
    monkeypatch.setattr("dragoman.files.store.time", SimpleNamespace(time_ns=lambda: tick + 60 * 10**9))
    scans: list[object] = []
    real_scandir = os.scandir
    monkeypatch.setattr("dragoman.files.store.os.scandir", lambda path: scans.append(path) or real_scandir(path))
    assert not files.in_use() and not files.in_use()
    assert len(scans) == 1
    (root / "shared").mkdir()
    os.utime(root, ns=(tick + 1, tick + 1))
    assert files.in_use()


def test_a_file_id_the_gateway_does_not_have_is_left_as_sent(tmp_path: Path) -> None:
    """The translator answers it with a 404; passthrough forwards it (the upstream may know it)."""
    raw = body({"type": "image", "source": {"type": "file", "file_id": "file_011Elsewhere"}})
    assert asyncio.run(store(tmp_path).resolve(raw, 10**9, owner="")) is raw


def test_a_small_request_naming_a_large_file_many_times_is_refused_not_grown(tmp_path: Path) -> None:
    from dragoman.core.errors import RequestTooLarge

    files = store(tmp_path)

    async def main() -> None:
        pdf = await files.save("big.pdf", "application/pdf", b"%PDF-" + b"x" * 100_000, owner="")
        named = [{"type": "document", "source": {"type": "file", "file_id": pdf.id}}] * 8  # ~1 MB once filled in
        assert len(await files.resolve(body(*named[:2]), 1_000_000, owner="")) < 1_000_000  # two fit
        with pytest.raises(RequestTooLarge, match=r"messages\.0\.content\.\d\.source\.file_id"):
            await files.resolve(body(*named), 1_000_000, owner="")

    asyncio.run(main())


def test_a_deeply_nested_body_is_left_to_the_request_decoder(tmp_path: Path) -> None:
    raw = b'{"file_id": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert (
        asyncio.run(store(tmp_path).resolve(raw, 10**9, owner="")) is raw
    )  # the usual 400 comes from decoding it, not a 500 here


def test_foreign_or_corrupt_metadata_is_not_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "files"
    directory.mkdir()
    (directory / "file_foreign.json").write_text("{not json")
    files = store(tmp_path)
    with pytest.raises(NotFound):
        files.metadata("file_foreign", owner="")
    assert asyncio.run(files.page({}, owner=""))["data"] == []


def test_a_filename_keeps_only_its_last_component(tmp_path: Path) -> None:
    meta = asyncio.run(store(tmp_path).save("../../etc/passwd", "text/plain", b"x", owner=""))
    assert meta.filename == "passwd"
    assert (
        asyncio.run(store(tmp_path).save("C:\\\\Users\\\\me\\\\notes.txt", "text/plain", b"x", owner="")).filename
        == "notes.txt"
    )


def test_uploads_are_private_to_the_gateway_user(tmp_path: Path) -> None:
    files = store(tmp_path)
    meta = asyncio.run(files.save("a.txt", "text/plain", b"secret", owner=""))
    for directory in (tmp_path / "files", tmp_path / "files" / "shared"):
        assert directory.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "files" / "shared" / meta.id).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "files" / "shared" / (meta.id + ".json")).stat().st_mode & 0o777 == 0o600


# -- owners: each file is seen only by the key that uploaded it ---------------------------------

A, B = "a" * 32, "b" * 32  # two keys' digests (see auth.owner)


def test_a_file_is_seen_only_by_its_owner(tmp_path: Path) -> None:
    files = store(tmp_path)

    async def main() -> None:
        mine = await files.save("a.txt", "text/plain", b"for a", owner=A)
        assert files.metadata(mine.id, owner=A) == mine
        assert [f["id"] for f in (await files.page({}, owner=A))["data"]] == [mine.id]
        assert (await files.page({}, owner=B))["data"] == []
        unknown = "file_011NoSuchFile"
        for call in (lambda i: files.metadata(i, owner=B), lambda i: files.delete(i, owner=B)):
            with pytest.raises(NotFound) as theirs:
                call(mine.id)
            with pytest.raises(NotFound) as missing:
                call(unknown)
            assert theirs.value.message == missing.value.message.replace(unknown, mine.id)  # the same answer
        raw = body({"type": "document", "source": {"type": "file", "file_id": mine.id}})
        assert await files.resolve(raw, 10**9, owner=B) is raw  # left as sent, as an unknown id is
        assert "for a" in (await files.resolve(raw, 10**9, owner=A)).decode()
        with pytest.raises(NotFound):  # "" (no keys, or shared keys) is an owner like any other
            files.metadata(mine.id, owner="")
        assert files.delete(mine.id, owner=A).id == mine.id

    asyncio.run(main())


def test_the_owner_is_stored_on_disk_but_never_answered(tmp_path: Path) -> None:
    files = store(tmp_path)
    meta = asyncio.run(files.save("a.txt", "text/plain", b"x", owner=A))
    on_disk = json.loads((tmp_path / "files" / A / f"{meta.id}.json").read_text())  # in the owner's directory
    assert on_disk["owner"] == A
    answered = [msgspec.to_builtins(meta), msgspec.to_builtins(files.metadata(meta.id, owner=A)),
                *asyncio.run(files.page({}, owner=A))["data"]]  # fmt: skip
    for value in answered:
        assert set(value) == {"id", "created_at", "filename", "mime_type", "size_bytes", "type", "downloadable"}, value


def test_a_metadata_file_written_without_an_owner_belongs_to_the_empty_owner(tmp_path: Path) -> None:
    """Files uploaded before owners were recorded: served when keys are off or shared."""
    directory = tmp_path / "files"
    directory.mkdir()
    old = {"id": "file_011Old", "created_at": "2025-01-01T00:00:00.000000Z", "filename": "old.txt",
           "mime_type": "text/plain", "size_bytes": 7, "type": "file", "downloadable": False}  # fmt: skip
    (directory / "file_011Old.json").write_text(json.dumps(old))
    (directory / "file_011Old").write_bytes(b"old one")
    files = store(tmp_path)
    assert msgspec.to_builtins(files.metadata("file_011Old", owner="")) == old
    assert (asyncio.run(files.page({}, owner="")))["data"] == [old]
    raw = body({"type": "document", "source": {"type": "file", "file_id": "file_011Old"}})
    assert "old one" in asyncio.run(files.resolve(raw, 10**9, owner="")).decode()
    with pytest.raises(NotFound):
        files.metadata("file_011Old", owner=A)
    assert asyncio.run(files.page({}, owner=A))["data"] == []


def test_paging_runs_over_the_owners_files_only(tmp_path: Path) -> None:
    files = store(tmp_path)

    async def main() -> None:
        saved = []
        for i in range(6):  # interleaved: a, b, a, b, ...
            saved.append(await files.save(f"{i}.txt", "text/plain", b"x", owner=(A, B)[i % 2]))
        a_ids = [m.id for m in saved if saved.index(m) % 2 == 0][::-1]
        b_ids = [m.id for m in saved if saved.index(m) % 2 == 1][::-1]
        first = await files.page({"limit": "2"}, owner=A)
        assert [f["id"] for f in first["data"]] == a_ids[:2] and first["has_more"] is True
        rest = await files.page({"limit": "2", "page": first["next_page"]}, owner=A)
        assert [f["id"] for f in rest["data"]] == a_ids[2:] and rest["has_more"] is False
        assert [f["id"] for f in (await files.page({"after_id": a_ids[0]}, owner=A))["data"]] == a_ids[1:]
        assert [f["id"] for f in (await files.page({"before_id": a_ids[2]}, owner=A))["data"]] == a_ids[:2]
        assert [f["id"] for f in (await files.page({"ids": ",".join(a_ids + b_ids)}, owner=A))["data"]] == a_ids
        for cursor in ("after_id", "before_id"):  # another owner's file is an unknown cursor
            with pytest.raises(InvalidRequest, match=f"{cursor}: unknown file"):
                await files.page({cursor: b_ids[0]}, owner=A)
        files.delete(b_ids[1], owner=B)  # a cursor naming one's own deleted file still places; another's does not
        assert [f["id"] for f in (await files.page({"after_id": b_ids[1]}, owner=B))["data"]] == b_ids[2:]
        with pytest.raises(InvalidRequest, match="after_id: unknown file"):
            await files.page({"after_id": b_ids[1]}, owner=A)

    asyncio.run(main())


def test_named_in_tells_bodies_that_may_name_a_stored_file_and_skips_the_stat_for_small_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = store(tmp_path)
    small_without = body({"type": "text", "text": "hi"})
    small_with = body({"type": "document", "source": {"type": "file", "file_id": "file_x"}})
    large_without = body({"type": "text", "text": "x" * 20_000})
    large_with = body(
        {"type": "text", "text": "x" * 20_000}, {"type": "image", "source": {"type": "file", "file_id": "file_y"}}
    )
    assert not files.named_in(small_with) and not files.named_in(large_with)  # nothing uploaded yet
    asyncio.run(files.save("a.txt", "text/plain", b"one", owner=""))
    assert files.named_in(small_with) and files.named_in(large_with)
    assert not files.named_in(large_without)

    fresh = store(tmp_path)  # another process: it learns of uploads from the directory
    stats: list[object] = []
    real_stat = __import__("os").stat
    monkeypatch.setattr(
        "dragoman.files.store.os.stat", lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k)
    )
    assert not fresh.named_in(small_without)
    assert stats == []  # a small body without a file id costs no system call
    assert fresh.named_in(small_with)
    assert stats != []


# -- the layout: one directory per owner; files of the flat layout (earlier versions) ---------------


def test_an_upload_and_a_list_read_only_the_owners_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another key's files, however many, cost an owner's uploads and lists nothing."""
    files = store(tmp_path)
    asyncio.run(files.save("b.txt", "text/plain", b"of b", owner=B))
    read: list[Path] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read.append(path) or real(path))

    async def main() -> None:
        mine = await files.save("a.txt", "text/plain", b"of a", owner=A)
        assert [f["id"] for f in (await files.page({}, owner=A))["data"]] == [mine.id]
        assert files.metadata(mine.id, owner=A) == mine

    asyncio.run(main())
    assert read and all(path.parent == tmp_path / "files" / A for path in read), read


def flat(directory: Path, file_id: str, content: bytes | None, **fields: object) -> None:
    """A file as earlier versions wrote it: content and metadata in `files.dir` itself."""
    directory.mkdir(mode=0o700, exist_ok=True)
    meta = {"id": file_id, "created_at": "2025-01-01T00:00:00.000000Z", "filename": f"{file_id}.txt",
            "mime_type": "text/plain", "size_bytes": 3, "type": "file", "downloadable": False, **fields}  # fmt: skip
    (directory / f"{file_id}.json").write_text(json.dumps(meta))
    if content is not None:
        (directory / file_id).write_bytes(content)


def test_flat_files_are_served_before_and_after_being_moved_into_their_owners_directories(tmp_path: Path) -> None:
    directory = tmp_path / "files"
    flat(directory, "file_011Mine", b"one", owner=A)
    flat(directory, "file_011Shared", b"two")  # written before owners were recorded: the owner ""
    flat(directory, "file_011Gone", None, owner=A, expires_at="2020-01-01T00:00:00.000000Z")  # expired: no content
    (directory / "file_011Foreign.json").write_text("{not json")
    files = FileStore(FilesConfig(dir=str(directory), max_files=3))

    def served(*uploaded: str) -> None:
        assert sorted(f["id"] for f in asyncio.run(files.page({}, owner=A))["data"]) == sorted(
            ["file_011Gone", "file_011Mine", *uploaded]
        )
        assert [f["id"] for f in asyncio.run(files.page({}, owner=""))["data"]] == ["file_011Shared"]
        raw = body({"type": "document", "source": {"type": "file", "file_id": "file_011Mine"}})
        assert "one" in asyncio.run(files.resolve(raw, 10**9, owner=A)).decode()
        assert asyncio.run(content_of(files, "file_011Shared", owner="")) == b"two"
        with pytest.raises(NotFound):
            files.metadata("file_011Mine", owner=B)

    served()
    third = asyncio.run(files.save("a.txt", "text/plain", b"x", owner=A)).id  # the third of A's files: flat ones count
    with pytest.raises(InvalidRequest, match="3 of 3 files"):
        asyncio.run(files.save("a.txt", "text/plain", b"x", owner=A))

    asyncio.run(files.adopt_flat())
    assert sorted(p.name for p in directory.iterdir() if p.is_file()) == [
        "file_011Foreign.json"
    ]  # not ours: left as it is
    assert {p.name for p in (directory / A).iterdir()} >= {"file_011Mine", "file_011Mine.json", "file_011Gone.json"}
    assert sorted(p.name for p in (directory / "shared").iterdir()) == ["file_011Shared", "file_011Shared.json"]
    served(third)
    files.delete("file_011Mine", owner=A)
    assert not list(directory.rglob("file_011Mine*"))


def test_two_processes_moving_the_flat_files_at_once_lose_and_double_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "files"
    for n in range(4):
        flat(directory, f"file_011N{n}", f"content {n}".encode(), owner=(A, B)[n % 2])
    one, other = store(tmp_path), store(tmp_path)
    real = __import__("os").rename
    renames: list[object] = []

    def rename(source: Path, target: Path) -> None:  # the other process runs whole between this one's first two moves
        renames.append(source)
        if len(renames) == 2:
            asyncio.run(other.adopt_flat())
        real(source, target)

    monkeypatch.setattr("dragoman.files.layout.os.rename", rename)
    asyncio.run(one.adopt_flat())
    assert not [p for p in directory.iterdir() if p.is_file()]
    for n in range(4):
        owner = (A, B)[n % 2]
        assert [p.relative_to(directory) for p in directory.rglob(f"file_011N{n}*")] in (
            [Path(owner, f"file_011N{n}"), Path(owner, f"file_011N{n}.json")],
            [Path(owner, f"file_011N{n}.json"), Path(owner, f"file_011N{n}")],
        )
        assert asyncio.run(content_of(one, f"file_011N{n}", owner=owner)) == f"content {n}".encode()


def test_a_file_moved_while_it_is_looked_up_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files only move from flat to their owner's directory: the owner's is looked in again."""
    directory = tmp_path / "files"
    flat(directory, "file_011Moving", b"one", owner=A)
    files, mover = store(tmp_path), store(tmp_path)
    real, moved = Path.read_bytes, []

    def read_bytes(path: Path) -> bytes:
        if (
            path == directory / "file_011Moving.json" and not moved
        ):  # the owner's directory was looked in: now it moves there
            moved.append(path)
            asyncio.run(mover.adopt_flat())
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert files.metadata("file_011Moving", owner=A).id == "file_011Moving" and moved
    assert (directory / A / "file_011Moving.json").exists()


@pytest.mark.parametrize("field", ["3600²", "①②③④", "", " ", "36OO", "-3600", "3600.0", "1e4"])
def test_an_expiry_that_is_no_integer_is_a_400_naming_it(field: str) -> None:
    with pytest.raises(InvalidRequest, match=r"^expires_in_seconds: an integer from 3600"):
        _expires_in(field)


@pytest.mark.parametrize(("field", "seconds"), [("3600", 3600), (" 7776000 ", 7776000)])
def test_an_expiry_in_range_is_taken(field: str, seconds: int) -> None:
    assert _expires_in(field) == seconds


def test_deleted_files_are_remembered_within_a_bound_and_a_cursor_naming_a_recent_one_still_places(
    tmp_path: Path,
) -> None:
    """Every delete was remembered for the life of the process (a cursor naming the file
    must still place): a cleanup loop's deletes grew its memory for weeks."""
    files = FileStore(FilesConfig(dir=str(tmp_path / "files")), deleted_kept=2)

    async def main() -> list[str]:
        return [(await files.save(f"{i}.txt", "text/plain", b"x", owner="")).id for i in range(5)]

    made = asyncio.run(main())
    for file_id in made[:4]:
        files.delete(file_id, owner="")
    assert len(files._gone) == 2
    asyncio.run(files.page({"after_id": made[3]}, owner=""))  # the latest deleted still places: not an unknown id
    with pytest.raises(InvalidRequest):  # forgotten: an unknown id, as after a restart
        asyncio.run(files.page({"after_id": made[0]}, owner=""))
