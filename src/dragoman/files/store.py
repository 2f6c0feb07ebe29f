"""The Files API: files uploaded once and named by `file_id` in later requests.

Files are kept in a directory (`files.dir`), one content file and one metadata file per
upload, written atomically, so they survive restarts and every `--workers` process (or
replica sharing the directory) sees the same files. Each owner's files are in a
subdirectory of their own, so an upload or a list reads only the caller's files; files that
earlier versions kept flat are moved there at start-up and served from either place (see
`file_layout`). A request whose image or document block names a `file_id` has that source
replaced by the file's content (base64 for images and PDFs, text for text files; by the type
its first bytes show where the declared one is no help, see `sniff`) before it is routed, so
both the translating and the passthrough paths, token counting and batches get a request an
upstream can read. A file id the gateway does not have is left as sent: the translating path
answers it with a 404, passthrough forwards it (an Anthropic upstream may know it). As on
Anthropic, uploaded files cannot be downloaded again.

An upload may ask to expire (`expires_in_seconds`, 1 hour to 90 days, as on Anthropic): past its
`expires_at` the metadata stays (listed, retrievable, deletable) but the content is gone: naming
the file in a request is a 404 with `error_code` `file_expired`, and the bytes are removed then,
or at the owner's next upload, and no longer count towards the quota.

Each file belongs to the API key that uploaded it (its `owner`, a digest of the key, see
`auth.owner`), and only that key sees it: to any other key it is an unknown id. With no API
keys, or with `server.share_between_keys`, every caller is the owner "". A file written
before owners were recorded belongs to "".

An owner's files together hold at most `files.max_total_bytes`, and number at most
`files.max_files` (each file costs inodes and disk blocks whatever its size, and every list
reads them all): an upload that would pass either is refused (400) before anything is written.
Usage is the sum of the owner's stored metadata (its directory's), read at each upload, so a
delete frees its space at once. Nothing is locked: uploads in flight at the same moment (in
one process, or in several sharing the directory) may each pass the check, so the owner may
overshoot the quotas by at most those uploads.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec

from dragoman.core import ids
from dragoman.core.config import FilesConfig, data_dir
from dragoman.core.errors import InvalidRequest, NotFound, RequestTooLarge
from dragoman.core.owners import Owners
from dragoman.core.paging import list_param, page_of, remember_deleted
from dragoman.files.charsets import decode_text
from dragoman.files.layout import Layout
from dragoman.files.sniff import IMAGE_TYPES, PDF, is_text, usable_type
from dragoman.protocol.anthropic import timestamp

log = logging.getLogger("dragoman.files")
EXPIRES_IN = (3600, 7776000)  # the seconds an upload may ask to be kept, as on Anthropic (1 hour to 90 days)
RACY_NS = (
    2_000_000_000  # a directory's mtime this recent may yet stay the same through a change (a coarse tick: 2 s on FAT)
)


class FileMetadata(msgspec.Struct):
    id: str
    created_at: str
    filename: str
    mime_type: str
    size_bytes: int
    type: Literal["file"] = "file"
    downloadable: bool = False
    expires_at: str | msgspec.UnsetType = msgspec.UNSET  # only for an upload that asked to expire


class StoredFile(FileMetadata):
    """A file's metadata file: the API's metadata and its owner, never sent to clients.
    A metadata file written without an owner decodes with owner ""."""

    owner: str = ""

    def expired(self) -> bool:
        """Past its `expires_at`: its content is no longer available."""
        return isinstance(self.expires_at, str) and datetime.fromisoformat(self.expires_at) <= datetime.now(UTC)

    def public(self) -> FileMetadata:
        return FileMetadata(**{name: getattr(self, name) for name in FileMetadata.__struct_fields__})


class DeletedFile(msgspec.Struct):
    id: str
    type: Literal["file_deleted"] = "file_deleted"


class FileStore:
    def __init__(self, config: FilesConfig, owners: Owners | None = None) -> None:
        self.dir = self.directory(config)
        self._owners = owners  # reads owners that earlier versions recorded (see `core.owners`)
        self.layout = Layout(self.dir)
        self.max_bytes = config.max_bytes
        self.max_total_bytes = config.max_total_bytes
        self.max_files = config.max_files
        self._in_use = False
        self._gone: dict[
            tuple[str, str], str
        ] = {}  # deleted here (the latest): (owner, id) -> created_at, so a cursor naming one still places
        self._seen: int | None = None  # the directory's mtime when last looked into

    @staticmethod
    def directory(config: FilesConfig) -> Path:
        return Path(config.dir).expanduser() if config.dir else data_dir("files")

    def _recorded(self, metadata: bytes) -> StoredFile:
        """A metadata file, its owner as this gateway names it (`Owners.canonical`)."""
        stored = msgspec.json.decode(metadata, type=StoredFile)
        if self._owners is not None and stored.owner:
            stored.owner = self._owners.canonical(stored.owner)
        return stored

    def named_in(self, body: bytes) -> bool:
        """Whether a request body may name a stored file (to be resolved). The cheaper test
        goes first: for a small body the search, for a large one `in_use`'s stat (on an
        80 KB body the search costs ~25 µs)."""
        if len(body) <= 8192:
            return names_a_file(body) and self.in_use()
        return self.in_use() and names_a_file(body)

    def in_use(self) -> bool:
        """Whether any file has been uploaded to this directory (by any process): until
        then requests are not scanned for file ids (on an 80 KB request the scan costs
        ~25 µs; this check, one stat). Once true, it stays true.

        "Empty" is remembered against the directory's mtime only once that mtime is older than
        a timestamp tick (RACY_NS, as git judges a racily clean index): an owner's directory made
        in the same tick as the look would leave the mtime as it was, and the first upload of a
        new owner is the directory's last change until another new owner's, so a remembered
        "empty" would stick and file ids go unresolved in this process."""
        if self._in_use:
            return True
        try:
            mtime = os.stat(
                self.dir
            ).st_mtime_ns  # changes as an owner's directory (made before its first file) or a flat file is added
            if mtime != self._seen:
                with os.scandir(self.dir) as entries:
                    self._in_use = any(not entry.name.startswith(".") for entry in entries)  # not a temporary
                if time.time_ns() - mtime >= RACY_NS:  # else looked into again next time
                    self._seen = mtime
        except OSError:
            return False
        return self._in_use

    # -- the API ----------------------------------------------------------------------------

    async def save(
        self, filename: str, mime_type: str, data: bytes, *, owner: str, expires_in: int | None = None
    ) -> FileMetadata:
        if not data:
            raise InvalidRequest("file: the uploaded file is empty")
        now = datetime.now(UTC)
        stored = StoredFile(
            id=ids.new_id("file_011"), created_at=timestamp(now),
            expires_at=timestamp(now + timedelta(seconds=expires_in)) if expires_in is not None else msgspec.UNSET,
            filename=filename.replace("\\", "/").rsplit("/", 1)[-1] or _unnamed(mime_type),  # the last path component, as the SDK does
            mime_type=mime_type or "application/octet-stream", size_bytes=len(data), owner=owner,
        )  # fmt: skip
        await asyncio.to_thread(self._write_within_quota, stored, data)
        self._in_use = True
        return stored.public()

    def metadata(self, file_id: str, *, owner: str) -> FileMetadata:
        return self._load(file_id, owner).public()

    def delete(self, file_id: str, *, owner: str) -> DeletedFile:
        stored = self._load(file_id, owner)  # 404 if unknown, or another owner's
        remember_deleted(self._gone, (owner, file_id), stored.created_at)
        self.layout.remove(file_id, owner)
        return DeletedFile(id=file_id)

    async def page(self, query: Mapping[str, str], *, owner: str) -> dict[str, Any]:
        """The list (see `_page`), read in a thread: it opens every metadata file of the owner."""
        return await asyncio.to_thread(self._page, query, owner)

    def _page(self, query: Mapping[str, str], owner: str) -> dict[str, Any]:
        """The owner's files, newest first. Both pagination styles: `after_id`/`before_id`
        (the API reference) and the opaque `page` cursor with `next_page` (what the SDK's
        list iterator uses); `ids` restricts the list to those files (one page). Another
        owner's file is not listed and, as a cursor, is an unknown id."""
        metas = {file_id: stored.public() for file_id, stored in self._owned(owner).items()}
        order = sorted(metas, key=lambda file_id: (metas[file_id].created_at, file_id), reverse=True)
        wanted = list_param(query, "ids")
        params = {k: v for k, v in query.items() if k not in ("page", "ids", "ids[]")}
        cursor: dict[
            str, str
        ] = {}  # the page cursor's own time: placed even if the file is gone (kept for this call only)
        if "scope_id" in query:  # files of a session (the agent API's); none here has a scope
            order = []
            params.pop("scope_id")
        if wanted:
            order = [file_id for file_id in order if file_id in set(wanted)]
            params["limit"] = "1000"
        elif "page" in query:  # page_<created_at>~<id>: still valid once that file is deleted
            created, _, after = query["page"].removeprefix("page_").partition("~")
            if not query["page"].startswith("page_") or not after:
                raise InvalidRequest(f"page: not a cursor from this list ({query['page']!r})")
            cursor[after] = created
            params["after_id"] = after

        def position(gone: str) -> int | None:  # a file deleted since: after every newer one
            created = cursor.get(gone) or self._gone.get((owner, gone))
            return None if created is None else sum(1 for f in order if (metas[f].created_at, f) > (created, gone))

        listed = page_of(order, params, lambda file_id: msgspec.to_builtins(metas[file_id]), "file", position)
        more = listed["has_more"] and "before_id" not in params and not wanted
        last = listed["last_id"]
        listed["next_page"] = f"page_{metas[last].created_at}~{last}" if more and last else None
        return listed

    # -- file sources in requests ---------------------------------------------------------------

    async def resolve(self, body: bytes, limit: int, *, owner: str) -> bytes:
        """The request with every `{"type": "file", "file_id": ...}` source of an image or
        document block replaced by the file's content; at most `limit` bytes in all (a
        small request naming a large file many times must not grow without bound). Only
        `owner`'s files are filled in: another owner's is left as sent, as an unknown id
        is. Runs in a thread: reading files and base64-encoding them would hold up the
        event loop."""
        return await asyncio.to_thread(self._resolve, body, limit, owner)

    def _resolve(self, body: bytes, limit: int, owner: str) -> bytes:
        try:
            data = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return body  # the request's own decoding reports it, with its usual message
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list):
            return body
        loaded: dict[str, tuple[StoredFile, bytes] | None] = {}  # each file read once, however often it is named
        budget = [limit - len(body)]
        changed = False
        for m, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            changed |= self._resolve_blocks(content, f"messages.{m}.content", owner, loaded, budget)
        return msgspec.json.encode(data) if changed else body

    def _resolve_blocks(self, blocks: list[Any], where: str, owner: str, loaded: dict[str, tuple[StoredFile, bytes] | None],
                        budget: list[int], depth: int = 0) -> bool:  # fmt: skip
        """`_resolve_block` for each block and for the blocks they hold: a tool result's content,
        a document's `content` source (a document inside a tool result: two levels at most)."""
        changed = False
        for b, block in enumerate(blocks):
            changed |= self._resolve_block(block, f"{where}.{b}", owner, loaded, budget)
            if depth >= 2 or not isinstance(block, dict):
                continue
            source = block.get("source")
            if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                changed |= self._resolve_blocks(
                    block["content"], f"{where}.{b}.content", owner, loaded, budget, depth + 1
                )
            elif block.get("type") == "document" and isinstance(source, dict) and source.get("type") == "content" \
                    and isinstance(source.get("content"), list):  # fmt: skip
                changed |= self._resolve_blocks(
                    source["content"], f"{where}.{b}.source.content", owner, loaded, budget, depth + 1
                )
        return changed

    def _resolve_block(self, block: Any, where: str, owner: str, loaded: dict[str, tuple[StoredFile, bytes] | None],
                       budget: list[int]) -> bool:  # fmt: skip
        if not isinstance(block, dict) or block.get("type") not in ("image", "document"):
            return False
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") != "file":
            return False
        file_id = source.get("file_id")
        if not isinstance(file_id, str):
            raise InvalidRequest(f"{where}.source.file_id: a string is needed")
        if file_id not in loaded:
            try:
                stored: StoredFile | None = self._load(file_id, owner)
            except NotFound:
                stored = None
            if stored is not None and stored.expired():  # ours, so never forwarded: its bytes are gone for good
                self.layout.remove(file_id, owner, content_only=True)
                raise NotFound(f"{where}.source.file_id: {file_id} expired at {stored.expires_at}; its content is no longer "
                               "available", error_code="file_expired")  # fmt: skip
            try:
                loaded[file_id] = (stored, self.layout.read(file_id, owner, "")) if stored is not None else None
            except FileNotFoundError:  # deleted meanwhile
                loaded[file_id] = None
        found = loaded[file_id]
        if (
            found is None
        ):  # unknown, or another owner's: the translator answers 404; passthrough forwards it (the upstream may know it)
            return False
        meta, data = found
        budget[0] -= len(data) * 4 // 3 + 64  # what it adds, base64 or text
        if budget[0] < 0:
            raise RequestTooLarge(f"{where}.source.file_id: with the files it names filled in, the request would pass "
                                  "server.max_request_bytes")  # fmt: skip
        usable = usable_type(
            meta.mime_type, data
        )  # what its first bytes show, where the declared type does not fit them
        mime = usable.partition(";")[0].strip().lower()
        if block["type"] == "image":
            if mime not in IMAGE_TYPES:
                raise InvalidRequest(
                    f"{where}.source.file_id: {file_id} is {mime}, not an image ({', '.join(IMAGE_TYPES)})"
                )
            block["source"] = {"type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}
        elif mime == PDF:
            block["source"] = {"type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}
        elif is_text(mime):
            block["source"] = {"type": "text", "media_type": "text/plain", "data": decode_text(data, _charset(usable))}
        else:
            raise InvalidRequest(f"{where}.source.file_id: {file_id} is {mime}; a document must be a PDF or text")
        return True

    # -- storage ------------------------------------------------------------------------------

    def _load(self, file_id: str, owner: str) -> StoredFile:
        """The file's stored metadata; NotFound if it is absent or another owner's (the
        same answer: whether another key's file exists is not told)."""
        try:
            stored = self._recorded(self.layout.read(file_id, owner, ".json"))
        except (OSError, msgspec.DecodeError):  # absent (or not an id), or not a file of ours
            stored = None
        if stored is None or stored.owner != owner:
            raise NotFound(f"file_id: no file {file_id!r}")
        return stored

    def _owned(self, owner: str) -> dict[str, StoredFile]:
        """The stored metadata of every file of `owner`, by id: it opens the metadata files
        in the owner's directory (and any left in the flat layout), no other owner's."""
        owned = {}
        for file_id, path in self.layout.metadata_paths(owner).items():
            try:
                stored = self._recorded(path.read_bytes())
            except (OSError, msgspec.DecodeError):
                continue  # deleted (or moved) meanwhile, or not ours
            if stored.owner == owner:
                owned[file_id] = stored
        return owned

    async def adopt_flat(self) -> None:
        """At start-up, in a thread: move the files earlier versions wrote flat into their
        owners' directories (see `file_layout`). Safe while this and other processes serve
        (they read both layouts) and do the same."""
        try:
            moved = await asyncio.to_thread(self.layout.adopt_flat, self._owner_of)
        except OSError as error:  # the flat files left are still served, and moved at the next start
            log.warning("files: moving the flat layout's files into their owners' directories stopped: %s", error)
        else:
            if moved:
                log.info("files: moved %d files of the flat layout into their owners' directories", moved)

    def _owner_of(self, metadata: bytes) -> str | None:
        """A metadata file's owner; None if it is not a file of ours."""
        try:
            return self._recorded(metadata).owner
        except msgspec.DecodeError:
            return None

    def _write_within_quota(self, meta: StoredFile, data: bytes) -> None:
        """`_write`, unless the owner's files would then pass `files.max_files` or
        `files.max_total_bytes`. Not atomic across processes: see the module's docstring."""
        used, owned = 0, self._owned(meta.owner)
        if len(owned) >= self.max_files:  # expired ones too: their metadata stays until deleted
            raise InvalidRequest(f"file: this upload would pass files.max_files: you already have {len(owned)} of "
                                 f"{self.max_files} files; delete some to make room", error_code="storage_quota_exceeded")  # fmt: skip
        for file_id, stored in owned.items():
            if stored.expired():  # its content is gone: it no longer takes space
                self.layout.remove(file_id, meta.owner, content_only=True)
            else:
                used += stored.size_bytes
        if (
            used + meta.size_bytes > self.max_total_bytes
        ):  # the message names sizes only, never the owner (a digest of a key)
            raise InvalidRequest(f"file: this upload of {meta.size_bytes} bytes would pass files.max_total_bytes: your files "
                                 f"already use {used} of {self.max_total_bytes} bytes; delete some to make room",
                                 error_code="storage_quota_exceeded")  # fmt: skip
        self.layout.write(meta.id, meta.owner, data, msgspec.json.encode(meta))


EXTENSIONS = {"image/jpeg": ".jpg", "image/png": ".png", "image/gif": ".gif", "image/webp": ".webp", "application/pdf": ".pdf",
              "text/plain": ".txt", "text/markdown": ".md", "text/csv": ".csv", "text/html": ".html", "application/json": ".json"}  # fmt: skip


def _unnamed(mime_type: str) -> str:
    """The name of an upload sent without one: `unnamed` and its type's extension, as on Anthropic."""
    return "unnamed" + EXTENSIONS.get(mime_type.partition(";")[0].strip().lower(), "")


def _charset(mime_type: str) -> str | None:
    """The text encoding the upload declared (`text/csv; charset=windows-1252`), if any: it is
    honoured (charsets.decode_text), not read as UTF-8 into replacement characters."""
    for param in mime_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value
    return None


def names_a_file(body: bytes) -> bool:
    """A cheap pre-check, so requests without file sources pay nothing."""
    return b'"file_id"' in body
