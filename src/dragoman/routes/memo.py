"""What routes read of a large part of a passed-through body (its tools, its system prompt),
kept for the next request that sends the same bytes. Claude Code sends the same ones on every
turn: reading the `type`s of 15 KB of tools costs about 10 µs, comparing the bytes 0.3.

Exact: a part is looked up by its length, and used only if every byte is equal (a part of
the same length and other bytes takes its place). Bounded: at most SIZE parts of at most
LARGEST bytes, the least recently used out. A pure module: no I/O, nothing of dragoman's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec

SIZE = 16
SMALLEST = 2048  # smaller parts are read again: as cheap as a look-up
LARGEST = 256 * 1024  # larger ones too: at most SIZE x LARGEST kept (4 MB a memo; a table has two)

T = TypeVar("T")


class Memo(Generic[T]):
    """`derive(part)`, kept for the same bytes; what it returns is shared: never changed."""

    def __init__(self, derive: Callable[[msgspec.Raw], T], size: int = SIZE) -> None:
        self._derive = derive
        self._size = size
        self._kept: OrderedDict[int, tuple[msgspec.Raw, T]] = OrderedDict()

    def __call__(self, part: msgspec.Raw) -> T:
        length = len(part)
        if length < SMALLEST or length > LARGEST:
            return self._derive(part)
        kept = self._kept.get(length)
        if kept is not None and kept[0] == part:  # one memcmp
            self._kept.move_to_end(length)
            return kept[1]
        value = self._derive(part)
        self._kept[length] = (part.copy(), value)  # its own bytes: not a view that keeps the body
        self._kept.move_to_end(length)
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every part kept (as if none had been seen)."""
        self._kept.clear()
