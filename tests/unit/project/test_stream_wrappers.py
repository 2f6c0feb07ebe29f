"""Nothing wraps a stream's chunks or turns its direct writes off: once a stream has started
the pump writes straight to the client, and a wrapper of `Streaming.chunks` would see only
its first event, with no test failing. What wants a stream registers on the reply
(`Streaming.observe`, `Streaming.transform`), which the pump runs on both paths."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "dragoman"
WRAPPING = re.compile(r"\.chunks\s*=(?!=)|\.direct\s*=\s*None")


def test_no_module_wraps_a_streams_chunks_or_turns_its_direct_writes_off() -> None:
    found = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path.parent.name != "calls"  # where `Streaming` runs stages around a stream no pump reads
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if WRAPPING.search(line)
    ]
    assert found == [], "register on the reply instead (docs/architecture.md, streams): " + "; ".join(found)


def test_the_check_finds_the_two_ways_a_wrapper_goes_wrong() -> None:
    assert WRAPPING.search("reply.chunks = trace.watch(reply.chunks)")
    assert WRAPPING.search("reply.direct = None  # every chunk passes `watch`")
    assert not WRAPPING.search("if reply.chunks == other:") and not WRAPPING.search("self.direct.writer = None")
