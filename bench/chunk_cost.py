"""CPU per streamed chunk of each path's own work, in a loop: no sockets, no event loop.

    python bench/chunk_cost.py [--streams 400] [--rounds 5]
    python bench/chunk_cost.py --instructions     # the same cells in instructions (valgrind's callgrind)

A whole stream as the fake upstream writes it (`bench/fake_upstream.py`: the same bytes,
without the HTTP framing) goes through each path's transformer from its first byte to its
last: `translated`, Chat Completions chunks through `Translation` (decoded, translated,
encoded); `passthrough`, Anthropic events through `Relay`. The reads are cut three ways:
`alone`, one event per read, written straight to the client once the stream has started
(`feed_to`: tokens as a model sends them, or each HTTP chunk handed on by itself); `direct-16`,
16 events per read the same way (a read holding several chunks); `burst`, the whole stream in
one read, yielded (`feed`: a client slower than the model, c=32). CPU per text token: the
best of `--rounds` rounds of process CPU time over `--streams` streams, per size. With
`--instructions`, user-space instructions per token instead, the same under any load: each
cell run under callgrind twice, with 10 and 60 streams of 100 tokens (2 and 12 of 500), the difference divided.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dragoman.backends.anthropic.relay import Relay  # noqa: E402
from dragoman.backends.openai.backend import _sse  # noqa: E402
from dragoman.backends.openai.stream import Translation  # noqa: E402
from dragoman.calls.types import Call  # noqa: E402
from dragoman.core.redaction import NO_KEYS  # noqa: E402
from dragoman.translate.stream import StreamTranslator  # noqa: E402
from fake_upstream import Canned  # noqa: E402

MODEL = "bench-model"


def unframed(frames: bytes) -> list[bytes]:
    """The events of chunked-encoding frames (`size\\r\\ndata\\r\\n` each; the last, empty, ends)."""
    events, at = [], 0
    while True:
        line = frames.index(b"\r\n", at)
        size = int(frames[at:line], 16)
        if size == 0:
            return events
        events.append(frames[line + 2 : line + 2 + size])
        at = line + 2 + size + 2


def streams(tokens: int) -> dict[str, list[bytes]]:
    """Each path's stream of `tokens` tokens, one event per item, as the fake writes it."""
    canned = Canned(MODEL)
    prompt = 40
    chat = canned.oa_first + canned.run("oa", tokens) + canned.oa_tail(tokens, prompt)
    messages = canned.an_head(prompt) + canned.run("an", tokens) + canned.an_tail(tokens)
    return {"translated": unframed(chat), "passthrough": unframed(messages)}


class Sink:
    def write(self, data: bytes) -> None:
        pass

    def ready(self) -> bool:
        return True


def drain(outputs: AsyncIterator[bytes]) -> None:
    """An async generator that never waits, run to its end without an event loop."""
    while True:
        try:
            outputs.__anext__().send(None)
        except StopIteration:
            continue
        except StopAsyncIteration:
            return


def translated() -> Translation[bytes]:
    translator = StreamTranslator(model=MODEL, message_id="msg_1", new_tool_id=lambda: "toolu_1")
    return Translation("bench", translator, None, _sse, None, sse=True)


CALL = Call(body=b"{}", model=MODEL, upstream_model=MODEL, headers={}, request_id="r", outcome=None, request=None)


def passthrough() -> Relay:
    return Relay("bench", CALL, {}, dict, committed=False, redactor=NO_KEYS)


MAKERS: dict[str, Callable[[], Translation[bytes] | Relay]] = {"translated": translated, "passthrough": passthrough}


def one_stream(path: str, reads: Iterable[bytes], direct: bool) -> None:
    t, sink = MAKERS[path](), Sink()
    for data in reads:
        if t.ended:
            break
        if direct and t.started:
            t.feed_to(data, sink)  # type: ignore[arg-type]
        else:
            for _ in t.feed(data):
                pass
    drain(t.finish())  # type: ignore[arg-type]


def reads_of(events: list[bytes], framing: str) -> list[bytes]:
    if framing == "burst":
        return [b"".join(events)]
    per = 16 if framing == "direct-16" else 1
    return [b"".join(events[i : i + per]) for i in range(0, len(events), per)]


def per_token(path: str, events: list[bytes], framing: str, tokens: int, n: int) -> float:
    reads = reads_of(events, framing)
    direct = framing != "burst"
    one_stream(path, reads, direct)  # warm
    started = time.process_time()
    for _ in range(n):
        one_stream(path, reads, direct)
    return (time.process_time() - started) / (n * tokens) * 1e6


def instructions(path: str, framing: str, tokens: int, n: int) -> int:
    """User-space instructions of a run of `n` streams (setup included), under callgrind."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg", sys.executable, __file__,
             "--one", f"{path}:{framing}:{tokens}:{n}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found is not None, done.stderr
    return int(found.group(1))


def per_token_instructions(path: str, framing: str, tokens: int) -> float:
    few, many = (10, 60) if tokens == 100 else (2, 12)
    return (instructions(path, framing, tokens, many) - instructions(path, framing, tokens, few)) / (
        (many - few) * tokens
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=400, help="streams per round (of 100 tokens; a fifth of 500)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="instructions per token, under callgrind")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # path:framing:tokens:n, run once (under callgrind)
    args = parser.parse_args()
    if args.one:
        path, framing, size, count = args.one.split(":")
        reads = reads_of(streams(int(size))[path], framing)
        for _ in range(int(count)):
            one_stream(path, reads, framing != "burst")
        return
    unit = "instructions" if args.instructions else "µs of CPU"
    print(f"{'tokens':>6} {'framing':10} {'translated':>12} {'passthrough':>12} {'ratio':>6}   ({unit} per token)")
    for tokens in (100, 500):
        paths = streams(tokens)
        n = max(1, args.streams * 100 // tokens)
        for framing in ("alone", "direct-16", "burst"):
            if args.instructions:
                best = {path: per_token_instructions(path, framing, tokens) for path in paths}
            else:
                best = {
                    path: min(per_token(path, paths[path], framing, tokens, n) for _ in range(args.rounds))
                    for path in paths
                }
            ours, theirs = best["translated"], best["passthrough"]
            print(f"{tokens:6} {framing:10} {ours:12.2f} {theirs:12.2f} {ours / theirs:6.2f}")


if __name__ == "__main__":
    main()
