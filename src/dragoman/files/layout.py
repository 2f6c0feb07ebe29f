"""Where the Files API keeps each upload in `files.dir`: one subdirectory per owner, so an
upload's quota check and a list read the caller's own files, never every owner's.

    <dir>/<owner>/file_…, file_….json   a key's files (content, metadata); <owner> is its digest (`auth.owner`)
    <dir>/shared/file_…, file_….json    the owner "": no API keys, or `server.share_between_keys`
    <dir>/file_…, file_….json           the flat layout of earlier versions (every owner's together)

Every lookup knows the caller's owner as well as the id, so the path follows from the two and
no index is kept: another owner's file is not in the caller's directory, the same answer as an
unknown id. Ids and owners are checked to be plain names: never a path outside the directory.

Flat files are moved into their owner's directory at start-up (`adopt_flat`): the content,
then the metadata, each by one rename, which is atomic; a process moving the same file at the
same time finds it gone and passes it by, so none is lost or doubled. Until moved (or if an
older version still writes some, during an upgrade) they are read where they are: a lookup
tries the owner's directory, the flat one, then the owner's again, so a file moved meanwhile
(files only ever move from flat to the owner's) is still found.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dragoman.core import storage
from dragoman.core.storage import sync_dir, write_atomically

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root

    def owner_dir(self, owner: str) -> Path:
        """The directory of `owner`'s files (see `storage.owner_dir`)."""
        return storage.owner_dir(self.root, owner)

    def read(self, file_id: str, owner: str, suffix: str) -> bytes:
        """A file's content (suffix "") or metadata (".json"), wherever it is; FileNotFoundError
        if neither layout has it (absent, or another owner's in the owner's layout)."""
        own, flat = self.owner_dir(owner) / _name(file_id, suffix), self.root / _name(file_id, suffix)
        for path in (own, flat, own):  # own again: moved from flat between the first two looks
            try:
                return path.read_bytes()
            except FileNotFoundError:
                continue
        raise FileNotFoundError(file_id + suffix)

    def metadata_paths(self, owner: str) -> dict[str, Path]:
        """Every metadata file that may be `owner`'s, by id: those in its directory and any
        left flat (the caller checks their owner). Flat first: a file moved meanwhile is
        then seen in one or the other."""
        found = {path.stem: path for path in self.root.glob("file_*.json")}
        found.update((path.stem, path) for path in self.owner_dir(owner).glob("file_*.json"))
        return found

    def write(self, file_id: str, owner: str, data: bytes, metadata: bytes) -> None:
        """Content first, then metadata: a file is listed only when whole."""
        directory = self.owner_dir(owner)
        self.root.mkdir(
            mode=0o700, parents=True, exist_ok=True
        )  # uploads are the clients' data: not for other local users
        directory.mkdir(mode=0o700, exist_ok=True)
        for suffix, payload in (("", data), (".json", metadata)):
            write_atomically(directory / _name(file_id, suffix), payload)

    def remove(self, file_id: str, owner: str, *, content_only: bool = False) -> None:
        """Metadata first (a half-removed file is not listed), flat before the owner's: a file
        being moved from flat to the owner's directory meanwhile is removed in either place."""
        for suffix in ("",) if content_only else (".json", ""):
            for directory in (self.root, self.owner_dir(owner)):
                (directory / _name(file_id, suffix)).unlink(missing_ok=True)

    def adopt_flat(self, owner_of: Callable[[bytes], str | None]) -> int:
        """Move the flat layout's files into their owners' directories (see the module's
        docstring); the number moved. `owner_of` reads a metadata file's owner, None if
        it is not a file of ours (left as it is)."""
        try:
            with os.scandir(self.root) as entries:
                ids = [entry.name[:-5] for entry in entries if entry.name.endswith(".json") and _is_id(entry.name[:-5])]
        except FileNotFoundError:
            return 0
        moved, touched = 0, set[Path]()
        for file_id in ids:
            try:
                owner = owner_of((self.root / f"{file_id}.json").read_bytes())
                directory = self.owner_dir(owner) if owner is not None else None
            except (OSError, ValueError):  # moved or deleted meanwhile, or an owner no directory can be named after
                continue
            if directory is None:
                continue
            directory.mkdir(mode=0o700, exist_ok=True)
            for suffix in ("", ".json"):  # content first: metadata in the owner's directory has its content there
                try:
                    os.rename(self.root / (file_id + suffix), directory / (file_id + suffix))
                except FileNotFoundError:  # moved by another process, deleted, or an expired file's content
                    continue
                moved += suffix == ".json"
                touched.add(directory)
        for directory in (*touched, self.root) if touched else ():
            sync_dir(directory)
        return moved


def _name(file_id: str, suffix: str) -> str:
    if not _is_id(file_id):  # never a path outside the directory
        raise FileNotFoundError(file_id)
    return file_id + suffix


def _is_id(name: str) -> bool:
    return name.startswith("file_") and set(name) <= _ID_CHARS
