"""Message threads: conversations the gateway holds between turns.

A request with `thread: {"type": "create"}` asks the server to hold its conversation
under the reply's id; `{"type": "continue", "previous_message_id": ...}` sends only the
new turn's messages (and no `system` or `tools`), which the gateway puts after the held
ones before the request goes on as usual. The official SDKs' tool runners and threads
send these on their own, so a gateway that ignored the field would lose the history.

Threads live in this process's memory, bounded in bytes and time, and shared fairly
between owners (API keys or tenants): an owner holds at most MAX_OWNER_BYTES, and when
all together pass MAX_HELD_BYTES the owner holding the most loses its oldest, so that one
owner's many threads cannot push out another's. One that is gone (a restart, another
worker, eviction) is answered `thread_not_found`, upon which the SDKs
send the whole conversation again under a new thread: losing one costs a longer
request, never a wrong answer. Each reply can be continued once, as on Anthropic.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from dragoman.calls.types import Finish, Streaming
from dragoman.core.errors import InvalidRequest, NotFound
from dragoman.protocol.sse import DataDecoder
from dragoman.translate import fold

MAX_HELD_BYTES = 256 * 1024 * 1024  # held conversations, as JSON, in all
MAX_OWNER_BYTES = 64 * 1024 * 1024  # of which one owner's (an API key's, or a tenant's; "", everyone, has all)
HELD_FOR = 24 * 3600.0  # seconds since a thread's last turn
CREATE_ONLY = ("system", "tools")  # sent with `create`, held for every later turn
ENTRY_BYTES = 200  # what an entry costs beside its JSON: a continued one, kept to say so, costs this much


class ThreadError(InvalidRequest):
    """A thread request the gateway cannot continue; `error_code` says why (the SDKs act on it)."""

    def __init__(self, message: str, error_code: str) -> None:
        super().__init__(message)
        self.details = {"error_code": error_code}


class ThreadNotFound(NotFound):
    def __init__(self, message_id: str) -> None:
        super().__init__(f"thread.previous_message_id: no conversation is held for {message_id!r}; "
                         'send the whole conversation with thread: {"type": "create"}')  # fmt: skip
        self.details = {"error_code": "thread_not_found"}


@dataclass(slots=True)
class Held:
    fields: bytes  # the create-only fields, a JSON object
    messages: bytes  # the conversation so far, reply included: a JSON array
    used: float
    continued: bool = False
    in_flight: bool = False

    @property
    def size(self) -> int:
        return len(self.fields) + len(self.messages) + ENTRY_BYTES


class ThreadStore:
    def __init__(self, *, max_bytes: int = MAX_HELD_BYTES, max_owner_bytes: int = MAX_OWNER_BYTES,
                 held_for: float = HELD_FOR, clock: Callable[[], float] = time.monotonic,
                 max_folded: int = fold.MAX_FOLDED) -> None:  # fmt: skip
        self._held: OrderedDict[tuple[str, str], Held] = OrderedDict()  # oldest first
        self._owned: dict[str, OrderedDict[tuple[str, str], None]] = {}  # each owner's keys, oldest first
        self._owner_bytes: dict[str, int] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_owner_bytes = max_owner_bytes
        self._held_for = held_for
        self._clock = clock
        self.max_folded = max_folded  # characters of a streamed reply held at most (a hostile stream)

    def __len__(self) -> int:
        return len(self._held)

    def open(self, body: bytes, owner: str) -> Turn:
        """The turn a threaded request body makes: its full body (held messages first,
        no `thread` field), and where its reply is to be held. Raises ThreadError or
        ThreadNotFound for a continuation that cannot go on."""
        request = msgspec.json.decode(body)
        thread = request.pop("thread")
        previous: tuple[str, str] | None = None
        fields: dict[str, Any] = {name: request[name] for name in CREATE_ONLY if name in request}
        if thread["type"] == "continue":
            message_id = thread.get("previous_message_id")
            if not isinstance(message_id, str) or not message_id:
                raise InvalidRequest('thread.previous_message_id: required with thread: {"type": "continue"}')
            previous = (owner, message_id)
            held = self._find(previous)
            if held is None:
                raise ThreadNotFound(message_id)
            if held.continued:
                raise ThreadError(f"thread.previous_message_id: {message_id!r} was already continued; continue from the "
                                  "thread's latest reply", "thread_already_continued")  # fmt: skip
            if held.in_flight:
                raise ThreadError(f"thread.previous_message_id: another request is continuing from {message_id!r}",
                                  "thread_continue_in_flight")  # fmt: skip
            stored = msgspec.json.decode(held.fields)
            changed = [name for name in CREATE_ONLY if name in fields and fields[name] != stored.get(name)]
            if changed:
                raise ThreadError(f"{', '.join(changed)}: differs from the value held with the thread; send the held "
                                  'value, or the whole conversation with thread: {"type": "create"}',
                                  "thread_fingerprint_mismatch")  # fmt: skip
            fields = stored
            request.update(stored)
            request["messages"] = [*msgspec.json.decode(held.messages), *request.get("messages", [])]
            held.in_flight = True
        return Turn(
            self,
            owner,
            previous,
            msgspec.json.encode(fields),
            request.get("messages", []),
            msgspec.json.encode(request),
        )

    def _find(self, key: tuple[str, str]) -> Held | None:
        held = self._held.get(key)
        if held is not None and self._clock() - held.used > self._held_for:
            self._drop(key)
            return None
        return held

    def hold(self, key: tuple[str, str], fields: bytes, messages: bytes) -> None:
        held = Held(fields, messages, self._clock())
        if key in self._held:
            self._drop(key)
        owner = key[0]
        self._held[key] = held
        self._owned.setdefault(owner, OrderedDict())[key] = None
        self._resized(owner, held.size)
        while self._held:  # the expired go first (entries are in the order they were held)
            oldest = next(iter(self._held))
            if held.used - self._held[oldest].used <= self._held_for:
                break
            self._drop(oldest)
        while owner and self._owner_bytes.get(owner, 0) > self._max_owner_bytes:  # over its own budget: its oldest
            self._drop(next(iter(self._owned[owner])))
        while self._bytes > self._max_bytes:  # over the whole budget: the oldest of the owner holding most
            largest = max(self._owner_bytes, key=self._owner_bytes.__getitem__)
            self._drop(next(iter(self._owned[largest])))

    def _drop(self, key: tuple[str, str]) -> None:
        held = self._held.pop(key)
        owned = self._owned[key[0]]
        del owned[key]
        self._resized(key[0], -held.size)

    def _resized(self, owner: str, change: int) -> None:
        self._bytes += change
        left = self._owner_bytes.get(owner, 0) + change
        if left > 0 or self._owned.get(owner):
            self._owner_bytes[owner] = left
        else:  # an owner holding nothing costs nothing
            self._owner_bytes.pop(owner, None)
            self._owned.pop(owner, None)

    def ended(self, previous: tuple[str, str] | None, *, continued: bool) -> None:
        if previous is None:
            return
        held = self._held.get(previous)
        if held is None:
            return
        held.in_flight = False
        if continued:  # the conversation lives on under the new reply: keep only the mark
            held.continued = True
            before = held.size
            held.fields = held.messages = b""
            self._resized(previous[0], held.size - before)


class Turn:
    """One threaded request: its full body, and holding its reply once it is whole."""

    __slots__ = ("_store", "_owner", "_previous", "_fields", "_messages", "body", "_ended")

    def __init__(self, store: ThreadStore, owner: str, previous: tuple[str, str] | None, fields: bytes,
                 messages: list[Any], body: bytes) -> None:  # fmt: skip
        self._store = store
        self._owner = owner
        self._previous = previous
        self._fields = fields
        self._messages = messages
        self.body = body
        self._ended = False

    def answered(self, reply: dict[str, Any] | None) -> None:
        """The reply (a Message as JSON), or None if there is no whole one: the turn ends."""
        if self._ended:
            return
        self._ended = True
        message_id = reply.get("id") if reply is not None else None
        if reply is None or not isinstance(message_id, str):
            self._store.ended(self._previous, continued=False)
            return
        assistant = {"role": "assistant", "content": reply.get("content", [])}
        messages = msgspec.json.encode([*self._messages, assistant])
        self._store.hold((self._owner, message_id), self._fields, messages)
        self._store.ended(self._previous, continued=True)

    def answered_json(self, status: int, body: bytes) -> None:
        reply = None
        if status == 200:
            try:
                decoded = msgspec.json.decode(body)
            except msgspec.DecodeError:
                decoded = None
            reply = decoded if isinstance(decoded, dict) and decoded.get("type") == "message" else None
        self.answered(reply)

    def follow(self, stream: Streaming, finish: Finish) -> None:
        """Hold the message `stream` carries once its `message_stop` goes by (before the
        client has it: its next turn finds this one held); a stream that ends without one
        ends the turn with nothing held, at the request's end."""
        folded = _Fold(self._store.max_folded)

        def seen(chunk: bytes) -> None:
            if not self._ended:
                folded.feed(chunk)
                if folded.stopped:
                    self.answered(folded.message())

        stream.observe(seen)
        finish.hold(functools.partial(self.answered, None))  # a no-op once answered


# The delta types whose pieces add up to a block's field, and the delta's key for the piece.
_PIECE_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "input"}
_DELTA_FIELDS = {"text": "text", "thinking": "thinking", "input": "partial_json"}


class _Fold:
    """The message of an SSE reply, folded from its events as plain JSON. Text and arguments
    are kept as pieces and joined once (`+=` would cost the square of their length); a reply
    past `limit` characters (`ThreadStore.max_folded`) is not held."""

    __slots__ = ("_decoder", "_message", "_blocks", "_pieces", "_size", "_stopped", "_broken", "_limit")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._decoder = DataDecoder()
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._pieces: dict[tuple[int, str], list[str]] = {}  # (block, field): what its deltas added
        self._size = 0
        self._stopped = False
        self._broken = False

    def feed(self, chunk: bytes) -> None:
        if self._broken or self._stopped:
            return
        for payload in self._decoder.feed(chunk):
            try:
                event = msgspec.json.decode(payload)
                self._apply(event)
            except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
                self._broken = True  # not a stream this can fold: nothing is held
                return
        if self._size > self._limit:
            self._broken = True
            self._pieces.clear()

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self._message = dict(event["message"])
        elif kind == "content_block_start":
            self._blocks[int(event["index"])] = dict(event["content_block"])
        elif kind == "content_block_delta":
            index, delta = int(event["index"]), event["delta"]
            block = self._blocks[index]
            field = _PIECE_FIELDS.get(delta["type"])
            if field is not None:
                piece = delta[_DELTA_FIELDS[field]]
                self._size += len(piece)
                self._pieces.setdefault((index, field), []).append(piece)
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "citations_delta":
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            self._broken = True

    @property
    def stopped(self) -> bool:
        """`message_stop` went by (or the stream is one this cannot fold)."""
        return self._stopped or self._broken

    def message(self) -> dict[str, Any] | None:
        if not self._stopped or self._broken or self._message is None:
            return None
        try:
            for (index, field), pieces in self._pieces.items():
                block, joined = self._blocks[index], "".join(pieces)
                if field == "input":
                    block["input"] = msgspec.json.decode(joined) if joined.strip() else {}
                else:
                    block[field] = (block.get(field) or "") + joined
        except (msgspec.DecodeError, KeyError, TypeError):
            return None
        return {**self._message, "content": [self._blocks[i] for i in sorted(self._blocks)]}
