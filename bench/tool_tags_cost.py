"""CPU of passed-through tool ids that name their replica (backends/anthropic/tool_tags.py), per
request, against what passthrough costs anyway.

    python bench/tool_tags_cost.py
    python bench/tool_tags_cost.py --repeat 9 --number 2000

Behind an upstream with replicas under cache_aware, a passed-through request's tagged ids are
put back to the server's (`untagged`) and its latest one read for placement (`latest_tag`,
from the envelope the core read already), if it had any; a reply's tool_use ids are tagged (`tagged_message`,
or `tagged_events` on a stream's read). Each is timed on the `claude-code` shape (80 KB, five
tool calls and their results) with its ids tagged, as Claude Code sends them back, and as they
are without tags (what every other request pays: the substring searches). Best of `--repeat`
runs of `--number` calls each: a loaded machine only adds.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path
from typing import Any

from dragoman.backends.anthropic.tool_tags import latest_tag, tagged_events, tagged_message, untagged
from dragoman.protocol.anthropic import ENVELOPE

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

TAG = "3fa9c1"


def _best(call: Any, repeat: int, number: int) -> float:
    """µs per call, best of `repeat`."""
    return min(timeit.repeat(call, repeat=repeat, number=number)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=1000)
    args = parser.parse_args()
    request = shapes.anthropic_request("claude-code", model="m", max_tokens=100, stream=True)
    plain = json.dumps(request).encode()
    sent_back = json.dumps(shapes.with_tagged_ids(request, TAG)).encode()
    use = {"type": "tool_use", "id": "call_0123456789", "name": "read_file", "input": {"path": "/src/app.py"}}
    reply = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [
        {"type": "text", "text": "I will read it. " * 20}, use], "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 20000, "output_tokens": 60}}).encode()  # fmt: skip
    text_reply = reply.replace(b'"tool_use"', b'"end_turn"').replace(b'"call_0123456789"', b'"x"')
    start = b"event: content_block_start\ndata: " + json.dumps(
        {"type": "content_block_start", "index": 1, "content_block": use | {"input": {}}}).encode() + b"\n\n"  # fmt: skip
    text = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the"}}\n\n'
    rows = []
    for name, body in (("ids tagged", sent_back), ("ids untagged", plain)):
        messages = ENVELOPE.decode(body).messages
        assert (latest_tag(body, messages) is not None) == (body is sent_back)
        rows.append((f"request ({name}, {len(body) // 1000} KB): untagged, latest_tag if it changed",
                     _best(lambda b=body, m=messages: untagged(b) is not b and latest_tag(b, m), args.repeat, args.number)))  # fmt: skip
    rows.append(
        ("reply, one tool call: tagged_message", _best(lambda: tagged_message(reply, TAG), args.repeat, args.number))
    )
    rows.append(
        ("reply, text: tagged_message", _best(lambda: tagged_message(text_reply, TAG), args.repeat, args.number))
    )
    rows.append(("stream read, content_block_start tool_use: tagged_events",
                 _best(lambda: tagged_events(start, TAG), args.repeat, args.number)))  # fmt: skip
    rows.append(('stream read, text delta: the `"tool_use"` search',
                 _best(lambda: b'"tool_use"' in text, args.repeat, args.number * 10)))  # fmt: skip
    for label, micros in rows:
        print(f"{micros:9.2f} µs  {label}")


if __name__ == "__main__":
    main()
