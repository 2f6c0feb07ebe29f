"""How long a long reply takes to fold: a non-streaming request read as a stream (stop
sequences, llama.cpp upstreams, batches), and a thread's held reply, both fold the
stream's events into one message, on the event loop. Joins there must be linear: a
`+=` per token once cost 2.8 s for 128k tokens and 16.7 s for 4 MB.

Usage: python bench/fold.py [--tokens 128000]
Prints one line per case: its name and the seconds it took. Each should stay well under 1 s.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable

import msgspec

from dragoman.assembly.threads import _Fold
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.protocol.sse import encode_all
from dragoman.translate.fold import Folder
from dragoman.translate.stream import StreamTranslator

TOKEN = "abcd"


def _chunk(delta: dict[str, object], finish: str | None = None) -> openai.ChatChunk:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return msgspec.json.decode(msgspec.json.encode(body), type=openai.ChatChunk)


def _chunks(tokens: int) -> list[openai.ChatChunk]:
    """A reply of `tokens` text tokens, then a tool call whose arguments come in `tokens` fragments."""
    text, fragment = (
        _chunk({"content": TOKEN}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": TOKEN}}]}),
    )
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": "'}}
    return [
        _chunk({"role": "assistant", "content": ""}), *[text] * tokens, _chunk({"tool_calls": [call]}),
        *[fragment] * tokens, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}, "tool_calls"),
    ]  # fmt: skip


def _events(chunks: list[openai.ChatChunk]) -> list[a.StreamEvent]:
    ids = (f"toolu_{n}" for n in itertools.count())
    translator = StreamTranslator(model="m", message_id="msg_1", new_tool_id=lambda: next(ids))
    events = translator.start()
    for chunk in chunks:
        events += translator.feed(chunk)
    return events + translator.finish()


def _timed(name: str, work: Callable[[], object]) -> None:
    start = time.perf_counter()
    work()
    print(f"{name:<24} {time.perf_counter() - start:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128_000)
    tokens = parser.parse_args().tokens
    chunks, events = _chunks(tokens), []
    _timed("translate", lambda: events.extend(_events(chunks)))
    folder = Folder()
    _timed("fold (non-streaming)", lambda: (folder.feed(events), folder.message()))
    sse = [encode_all([event]) for event in events]
    held = _Fold()
    _timed("fold (thread)", lambda: ([held.feed(chunk) for chunk in sse], held.message()))


if __name__ == "__main__":
    main()
