"""A note in the reply when the model never saw the request's tools, for the person at the client.

A model whose chat template has no place for tools (SmolLM2, the local model) answers Claude
Code's requests as if there were no tools: asked to read a file, it invents the contents. The
start-up warning and the `x-tools-dropped` header reach the operator, not the person in front of
Claude Code, so the first reply of each conversation gets one more text block, after the model's:
NOTE, marked as the gateway's. It cannot corrupt the conversation:

- it is added only to a conversation's first reply (no assistant turn in the request), so no
  state is kept and every worker and restart agrees;
- when a client sends it back in the history, `without_notes` takes it out before anything else
  reads the body (routing, counting, either backend path), so the model never sees it;
- it is its own block, last: the model's blocks, their indexes and the usage are untouched.

`server.tools_dropped_notice` says for whom: `claude-code` (its User-Agent), `all`, or `off`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal

import msgspec

from dragoman.calls.types import Call, Completed, Reply

NoticeMode = Literal["claude-code", "all", "off"]
MARK = "[dragoman gateway note]"
NOTE = (
    f"{MARK} The model behind this gateway cannot use tools: its chat template drops them, so it never saw "
    "the tools of this request (reading files, searching, editing, running commands), and what it says about "
    "files or the web is made up. Serve a model whose chat template supports tool calls "
    "(docs/claude-code.md in dragoman). This note is the gateway's: shown once per conversation, never sent "
    "to the model."
)
_MARK_BYTES = MARK.encode()  # as JSON encodes it: no character in it is escaped
_ASSISTANT_TURN = re.compile(rb'"role"\s*:\s*"assistant"')  # quotes in JSON strings are escaped: a key
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_INDEX = re.compile(rb'"index"\s*:\s*(\d+)')


def without_notes(body: bytes) -> bytes:
    """`body` with every NOTE taken out of its messages (a text block that was only the note goes),
    so the model never reads one a client sent back. Untouched, uncopied, when it holds none."""
    if _MARK_BYTES not in body:
        return body
    try:
        request = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body  # refused as it is, by the decoder that names the field
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return body
    request["messages"] = [m for m in (_cleaned(m) for m in request["messages"]) if m is not None]
    return msgspec.json.encode(request)


def _cleaned(value: Any) -> Any:
    """`value` with NOTE cut out of every string; a text block or message left empty by that, None."""
    if isinstance(value, str):
        return value.replace(NOTE, "").strip() if NOTE in value else value
    if isinstance(value, list):
        return [c for c in (_cleaned(v) for v in value) if c is not None]
    if not isinstance(value, dict):
        return value
    cleaned = {key: _cleaned(item) for key, item in value.items()}
    if value.get("type") == "text" and isinstance(value.get("text"), str) and NOTE in value["text"]:
        return cleaned if cleaned["text"] else None
    if "role" in value and value.get("content") != cleaned.get("content") and cleaned.get("content") in ([], ""):
        return None  # an assistant turn that was only the note
    return cleaned


def wants_note(call: Call, mode: NoticeMode) -> bool:
    """Whether this reply gets NOTE: its tools were dropped, it opens a conversation, and the
    client is one `mode` covers."""
    if mode == "off" or call.outcome is None or not call.outcome.tools_dropped:
        return False
    if mode == "claude-code" and not _is_claude_code(call.headers):
        return False
    return _ASSISTANT_TURN.search(call.body) is None


def _is_claude_code(headers: Mapping[str, str]) -> bool:
    return (headers.get("user-agent") or "").startswith("claude-cli/")


def noted(reply: Reply, call: Call, mode: NoticeMode) -> Reply:
    """`reply` with NOTE as its last text block when `wants_note`; else `reply` itself."""
    if not wants_note(call, mode):
        return reply
    if isinstance(reply, Completed):
        if reply.status == 200:
            reply.body = _message_with_note(reply.body)
        return reply
    reply.transform(_NoteBeforeEnd())
    return reply


def _message_with_note(body: bytes) -> bytes:
    message = msgspec.json.decode(body)
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return body
    message["content"].append({"type": "text", "text": NOTE})
    return msgspec.json.encode(message)


def note_events(index: int) -> bytes:
    """The note as a text block's three events, at block `index`."""
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": NOTE}}
    events = (
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", delta),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    )  # fmt: skip
    return b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), msgspec.json.encode(data)) for name, data in events)


class _NoteBeforeEnd:
    """A stream transform (`calls.streams`): the note's block goes in before `message_delta`,
    after every block of the model's. Whole events pass at once; a partial one (a stream no
    pump cuts into events) waits for its end, until the note is in."""

    __slots__ = ("next_index", "done", "pending")

    def __init__(self) -> None:
        self.next_index = 0
        self.done = False
        self.pending = b""

    def feed(self, chunk: bytes) -> Iterable[bytes]:
        if self.done:
            return (chunk,)
        data, out, start = self.pending + chunk, bytearray(), 0
        for end in _EVENT_END.finditer(data):
            event, start = data[start : end.end()], end.end()
            if not self.done and event.lstrip().startswith(b"event: message_delta"):
                out += note_events(self.next_index)
                self.done = True
            elif not self.done and b"content_block_start" in event and (index := _INDEX.search(event)):
                self.next_index = max(self.next_index, int(index.group(1)) + 1)
            out += event
        if self.done:
            out += data[start:]
            self.pending = b""
        else:
            self.pending = data[start:]
        return (bytes(out),) if out else ()

    async def finish(self) -> AsyncIterator[bytes]:
        if self.pending:  # a stream that ended without message_delta: what it sent, as it sent it
            yield self.pending
