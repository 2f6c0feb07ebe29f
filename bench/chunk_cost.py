"""CPU per streamed chunk of each path's own work, in a loop: no sockets, no event loop.

    python bench/chunk_cost.py [--chunks 200000]

`translated`: a vLLM-shaped Chat Completions chunk through `Translation.feed_to` (decoded,
translated, encoded, written to a writer that keeps nothing); `passthrough`: an Anthropic
`content_block_delta` through `Events.take`. Each alone in its read (tokens as a model
sends them), and 400 in one read (a burst). Best of 3 rounds of process CPU time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from dragoman.backends.anthropic.events import Events
from dragoman.backends.openai.backend import _sse
from dragoman.backends.openai.stream import Translation
from dragoman.calls.types import Call
from dragoman.translate.stream import StreamTranslator

WORDS = ["Hello", " world", ",", " this", " is", " a", " token", " é"]
OPENAI = [
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench-model",'
    b'"choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null}]}\n\n' % w.encode()
    for w in WORDS
]
ANTHROPIC = [
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"%s"}}\n\n' % w.encode()
    for w in WORDS
]
BURST = 400


class Sink:
    def write(self, data: bytes) -> None:
        pass

    def ready(self) -> bool:
        return True


def translation() -> Translation[bytes]:
    translator = StreamTranslator(model="m", message_id="msg_1", new_tool_id=lambda: "toolu_1")
    t = Translation("bench", translator, None, _sse, None, sse=True)
    t.started = True
    return t


def best(per_round: Callable[[], float]) -> float:
    return min(per_round() for _ in range(3))


def translated_alone(chunks: int) -> float:
    t, sink = translation(), Sink()
    t.feed_to(OPENAI[0], sink)  # type: ignore[arg-type]
    started = time.process_time()
    for i in range(chunks):
        t.feed_to(OPENAI[i & 7], sink)  # type: ignore[arg-type]
    return (time.process_time() - started) / chunks * 1e6


def passthrough_alone(chunks: int) -> float:
    call = Call(body=b"{}", model="m", upstream_model="m", headers={}, request_id="r", outcome=None, request=None)
    events, sink = Events(call, "bench"), Sink()
    started = time.process_time()
    for i in range(chunks):
        sink.write(events.take(ANTHROPIC[i & 7]))
    return (time.process_time() - started) / chunks * 1e6


def translated_burst(chunks: int) -> float:
    burst = b"".join(OPENAI[i & 7] for i in range(BURST))
    started = time.process_time()
    for _ in range(chunks // BURST):
        t, sink = translation(), Sink()
        t.feed_to(OPENAI[0], sink)  # type: ignore[arg-type]
        t.feed_to(burst, sink)  # type: ignore[arg-type]
    return (time.process_time() - started) / (chunks // BURST * BURST) * 1e6


def passthrough_burst(chunks: int) -> float:
    burst = b"".join(ANTHROPIC[i & 7] for i in range(BURST))
    call = Call(body=b"{}", model="m", upstream_model="m", headers={}, request_id="r", outcome=None, request=None)
    started = time.process_time()
    for _ in range(chunks // BURST):
        Sink().write(Events(call, "bench").take(burst))
    return (time.process_time() - started) / (chunks // BURST * BURST) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=200_000)
    n = parser.parse_args().chunks
    for name, path, passthrough in (("alone", translated_alone, passthrough_alone),
                                    ("burst", translated_burst, passthrough_burst)):  # fmt: skip
        ours, theirs = best(lambda: path(n)), best(lambda: passthrough(n))  # noqa: B023
        print(f"{name:6} translated {ours:6.2f} µs/chunk   passthrough {theirs:6.2f} µs/chunk   {ours / theirs:5.2f}x")


if __name__ == "__main__":
    main()
