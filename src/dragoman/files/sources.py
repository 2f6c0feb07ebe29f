"""`file` sources in a request filled in with the files' content, before it is routed.

An image or document block whose source names a `file_id` gets the file instead: base64 for
images and PDFs, text for text files (in the charset the upload declared; by the type its
first bytes show where the declared one is no help, see `sniff`). So the translating and the
passthrough paths, token counting and batches all get a request an upstream can read. A file
id the store does not give (unknown, or another owner's) is left as sent: the translating path
answers it with a 404, passthrough forwards it (an Anthropic upstream may know it).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import msgspec

from dragoman.core.errors import InvalidRequest, RequestTooLarge
from dragoman.files.charsets import decode_text
from dragoman.files.sniff import IMAGE_TYPES, PDF, is_text, usable_type

# (file_id, where it is named) -> the file's declared type and content, or None: left as sent
Fetch = Callable[[str, str], tuple[str, bytes] | None]


def fill_sources(body: bytes, limit: int, fetch: Fetch) -> bytes:
    """The request with each `file` source `fetch` gives replaced by the file's content; at
    most `limit` bytes in all (a small request naming a large file many times must not grow
    without bound). The body itself when nothing changed."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return body  # the request's own decoding reports it, with its usual message
    messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        return body
    loaded: dict[str, tuple[str, bytes] | None] = {}  # each file read once, however often it is named
    budget = [limit - len(body)]
    changed = False
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        changed |= _fill_blocks(content, f"messages.{m}.content", fetch, loaded, budget)
    return msgspec.json.encode(data) if changed else body


def _fill_blocks(blocks: list[Any], where: str, fetch: Fetch, loaded: dict[str, tuple[str, bytes] | None],
                 budget: list[int], depth: int = 0) -> bool:  # fmt: skip
    """`_fill_block` for each block and for the blocks they hold: a tool result's content,
    a document's `content` source (a document inside a tool result: two levels at most)."""
    changed = False
    for b, block in enumerate(blocks):
        changed |= _fill_block(block, f"{where}.{b}", fetch, loaded, budget)
        if depth >= 2 or not isinstance(block, dict):
            continue
        source = block.get("source")
        if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            changed |= _fill_blocks(block["content"], f"{where}.{b}.content", fetch, loaded, budget, depth + 1)
        elif block.get("type") == "document" and isinstance(source, dict) and source.get("type") == "content" \
                and isinstance(source.get("content"), list):  # fmt: skip
            changed |= _fill_blocks(source["content"], f"{where}.{b}.source.content", fetch, loaded, budget, depth + 1)
    return changed


def _fill_block(block: Any, where: str, fetch: Fetch, loaded: dict[str, tuple[str, bytes] | None],
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
        loaded[file_id] = fetch(file_id, where)
    found = loaded[file_id]
    if found is None:  # unknown, or another owner's: the translator answers 404; passthrough forwards it
        return False
    declared, data = found
    budget[0] -= len(data) * 4 // 3 + 64  # what it adds, base64 or text
    if budget[0] < 0:
        raise RequestTooLarge(f"{where}.source.file_id: with the files it names filled in, the request would pass "
                              "server.max_request_bytes")  # fmt: skip
    usable = usable_type(declared, data)  # what its first bytes show, where the declared type does not fit them
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
