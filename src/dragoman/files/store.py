"""The Files API: files uploaded once and named by `file_id` in later requests.

Files are kept in a directory (`files.dir`), one content file and one metadata file per
upload, written atomically, so they survive restarts and every `--workers` process (or
replica sharing the directory) sees the same files. Each owner's files are in a
subdirectory of their own, so an upload or a list reads only the caller's files; files that
earlier versions kept flat are moved there at start-up and served from either place (see
`file_layout`). A request that names a `file_id` gets the file's content in its place before
it is routed (`files.sources`). As on Anthropic, uploaded files cannot be downloaded again.

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
import functools
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
from dragoman.core.errors import InvalidRequest, NotFound
from dragoman.core.owners import Owners
from dragoman.core.paging import DELETED_KEPT, list_param, page_of, remember_deleted
from dragoman.files.layout import Layout
from dragoman.files.sources import fill_sources, names_a_file
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
    def __init__(self, config: FilesConfig, owners: Owners | None = None, deleted_kept: int = DELETED_KEPT) -> None:
        """`deleted_kept`: how many deleted ids a cursor may still name (the latest)."""
        self.dir = self.directory(config)
        self._deleted_kept = deleted_kept
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
        remember_deleted(self._gone, (owner, file_id), stored.created_at, self._deleted_kept)
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
        document block replaced by the file's content (`files.sources`); at most `limit` bytes
        in all. Only `owner`'s files are filled in: another owner's is left as sent, as an
        unknown id is. Runs in a thread: reading files and base64-encoding them would hold up
        the event loop."""
        return await asyncio.to_thread(fill_sources, body, limit, functools.partial(self._content, owner=owner))

    def _content(self, file_id: str, where: str, *, owner: str) -> tuple[str, bytes] | None:
        """The declared type and content of `owner`'s file, named by a source at `where`; None
        for an unknown id or another owner's. An expired file is a 404: it is ours, so it is
        never forwarded, and its bytes are gone for good."""
        try:
            stored = self._load(file_id, owner)
        except NotFound:
            return None
        if stored.expired():
            self.layout.remove(file_id, owner, content_only=True)
            raise NotFound(f"{where}.source.file_id: {file_id} expired at {stored.expires_at}; its content is no longer "
                           "available", error_code="file_expired")  # fmt: skip
        try:
            return stored.mime_type, self.layout.read(file_id, owner, "")
        except FileNotFoundError:  # deleted meanwhile
            return None

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
