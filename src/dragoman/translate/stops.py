"""Stop sequences matched in the gateway.

OpenAI-compatible servers strip a matched stop string and most do not say which one
matched (only vLLM and SGLang report it), some cap how many they take, and the
model may emit a stop string across chunk boundaries. Anthropic reports the exact
sequence, so the gateway matches them itself over the text it streams, holding
back only the few characters that could still begin a stop sequence.
"""

from __future__ import annotations


class StopMatcher:
    __slots__ = ("_stops", "_hold", "_pending", "matched")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s] if stops else stops
        self._hold = max(map(len, self._stops)) - 1 if self._stops else 0
        self._pending = ""
        self.matched: str | None = None

    def __bool__(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> str:
        """The text that is safe to emit now; sets `matched` when a stop is found."""
        if self.matched is not None:
            return ""
        buffer = self._pending + text
        # The stop that is complete first wins (a backend stops generating there), the
        # longer one on a tie, so the result is the same however the text is chunked.
        best: tuple[int, int] | None = None
        found = None
        for stop in self._stops:
            at = buffer.find(stop)
            if at != -1 and (best is None or (at + len(stop), at) < best):
                best, found = (at + len(stop), at), stop
        if found is not None and best is not None:
            self.matched = found
            self._pending = ""
            return buffer[: best[1]]
        keep = self._longest_partial(buffer)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """Text held back at the end of the reply, when no stop followed it."""
        rest, self._pending = self._pending, ""
        return rest if self.matched is None else ""

    def _longest_partial(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop."""
        for size in range(min(self._hold, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0


class PrefillEcho:
    """Drops a reply's repetition of the client's prefill.

    Some servers (llama.cpp) start a continued assistant turn by repeating the
    prefill; Anthropic's reply holds only the continuation. Text is held back
    only while it still matches the prefill's beginning.
    """

    __slots__ = ("_prefill", "_seen", "done")

    def __init__(self, prefill: str) -> None:
        self._prefill = prefill
        self._seen = ""
        self.done = not prefill  # nothing (more) to hold back: `feed` returns its text

    def feed(self, text: str) -> str:
        if self.done:
            return text
        seen = self._seen + text
        if len(seen) < len(self._prefill) and self._prefill.startswith(seen):
            self._seen = seen
            return ""
        self.done = True
        self._seen = ""
        return seen[len(self._prefill) :] if seen.startswith(self._prefill) else seen

    def flush(self) -> str:
        """A reply shorter than the prefill that matched it so far: give it back."""
        rest, self._seen, self.done = self._seen, "", True
        return rest
