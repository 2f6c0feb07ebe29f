"""`encrypted_content`: a search result's snippet, compressed and signed, so that a client can
send the result back on a later turn and any replica sharing the secret shows it to the model
again. Opaque to clients, as Anthropic's is; an altered one is refused (400)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import tempfile
import zlib
from pathlib import Path

import msgspec

from dragoman.core.config import data_dir
from dragoman.core.errors import InvalidRequest

log = logging.getLogger("dragoman.servertools")
_VERSION = b"\x01"
_MAC = 16  # bytes of HMAC-SHA256 kept


class Sealed(msgspec.Struct, array_like=True, frozen=True):
    """What a result's `encrypted_content` carries: enough to show the result to the model again."""

    url: str
    title: str
    snippet: str
    page_age: str | None = None


class Sealer:
    """Seals and opens `encrypted_content` with one secret (bytes)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def shared(cls, secret: str | None) -> Sealer:
        """With `secret` (`web_search.secret`, resolved from `secret_env` by `assembly.settings`);
        without one, this machine's own (`local_secret`)."""
        return cls(secret.encode() if secret else local_secret())

    def seal(self, item: Sealed) -> str:
        body = _VERSION + zlib.compress(msgspec.msgpack.encode(item))
        mac = hmac.new(self._secret, body, hashlib.sha256).digest()[:_MAC]
        return base64.urlsafe_b64encode(mac + body).decode().rstrip("=")

    def open(self, text: str, where: str) -> Sealed:
        """The sealed item, or a 400 naming `where` when it is not one this gateway sealed."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raw = b""
        mac, body = raw[:_MAC], raw[_MAC:]
        if len(raw) <= _MAC + 1 or not hmac.compare_digest(
            mac, hmac.new(self._secret, body, hashlib.sha256).digest()[:_MAC]
        ):
            raise InvalidRequest(f"{where}: invalid encrypted_content; send the block back exactly as it was received")
        try:
            return msgspec.msgpack.decode(zlib.decompress(body[1:], bufsize=4096), type=Sealed)
        except (zlib.error, msgspec.DecodeError):
            raise InvalidRequest(f"{where}: invalid encrypted_content") from None


def local_secret(directory: Path | None = None) -> bytes:
    """A secret kept in the data directory, made by the first process that needs it: every
    process of this machine (`--workers`, restarts) shares it. Replicas on other machines
    need `secret_env`. A directory that cannot be written: this process's own, said once."""
    path = (directory or data_dir("secrets")) / "web_search"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as error:
        return _own_secret(error)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent)  # mode 0600
        with os.fdopen(fd, "wb") as file:
            file.write(os.urandom(32))
        try:
            os.link(temporary, path)  # the first process to get here decides; the others read its secret
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        return path.read_bytes()
    except OSError as error:
        return _own_secret(error)


def _own_secret(error: OSError) -> bytes:
    log.warning("web_search: no secret could be kept in the data directory (%s); results are readable by this "
                "process only: set web_search.secret_env", error)  # fmt: skip
    return os.urandom(32)
