"""What a counting route table's read of a passed-through body's tools costs, as it is read
today and as it would be read split into keys: the trade-off behind the one line of
bench/routes_cost.py over issue 33's 20 µs (tools the process has not seen, with a count;
docs/performance-history.md, "Routes: the first sight of a tool set").

    python bench/tools_read.py
    python bench/tools_read.py --repeat 9 --number 5000

A table that counts keeps the tools as sent (a count's body holds their bytes) and reads their
facts (how many, the server tools' types) once per distinct bytes (`routes.memo.Memo`):

- today: a later turn compares the bytes to what it kept (`seen`); the first request with
  those tools reads them a second time (`first sight`), about 15 KB on the claude-code shape;
- split: the envelope's one pass reads each tool into its keys, values as sent, so the facts
  need no second read; every request then pays that pass's extra objects, and a count's body
  re-encodes the tools instead of copying their bytes.

msgspec gives a part either as sent or decoded, never both from one pass: there is no read
that costs neither. Best of `--repeat` runs of `--number` calls each; a loaded machine only adds.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from typing import Any

import msgspec

from dragoman.routes.memo import Memo
from dragoman.routes.reading import tool_facts
from dragoman.routes.shape import routed_envelope

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

Split = list[dict[str, msgspec.Raw]]


def split_facts(tools: Split) -> tuple[int, list[str]]:
    """`reading.tool_facts`, from tools split into keys (each `type` decoded alone)."""
    kinds = [msgspec.json.decode(raw) for tool in tools if (raw := tool.get("type")) is not None]
    return len(tools), [kind for kind in kinds if isinstance(kind, str) and kind != "custom"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=3000)
    args = parser.parse_args()
    body = shapes.anthropic_body("claude-code", model="bench-model", max_tokens=100, stream=True)
    kept = routed_envelope((), facts=False, split=True)  # a counting table's that asks the billing flag
    split = msgspec.defstruct("SplitEnvelope", [("tools", Split, [])], bases=(kept,), kw_only=True, dict=True)
    as_sent: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kept)
    into_keys: msgspec.json.Decoder[Any] = msgspec.json.Decoder(split)
    tools, parts = as_sent.decode(body).tools, into_keys.decode(body).tools
    memo = Memo(tool_facts)
    memo(tools)
    assert memo(tools) == tool_facts(tools) == split_facts(parts)
    encode = msgspec.json.Encoder().encode
    assert encode(parts) == bytes(tools)  # the same bytes (Claude Code sends them compact)

    def best(call: Any) -> float:
        """µs per call, best of `--repeat`."""
        return min(timeit.repeat(call, repeat=args.repeat, number=args.number)) / args.number * 1e6

    def first_sight() -> None:
        memo.clear()
        memo(tools)

    read = best(lambda: into_keys.decode(body)) - best(lambda: as_sent.decode(body))
    seen, first = best(lambda: memo(tools)), best(first_sight)
    facts = best(lambda: split_facts(parts))
    recoded = best(lambda: encode(parts)) - best(lambda: bytes(tools))
    print(f"claude-code shape: {len(body)} B, tools {len(tools)} B in {len(parts)} tools")
    print(f"today (kept as sent): seen {seen:5.1f} µs   first sight {first:5.1f} µs")
    line = f"split into keys:      every request {read + facts + recoded:5.1f} µs"
    print(f"{line}   (its read {read:+.1f}, facts {facts:.1f}, a count's body re-encoded {recoded:+.1f})")


if __name__ == "__main__":
    main()
