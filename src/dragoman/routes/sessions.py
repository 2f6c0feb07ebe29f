"""What routes remember of a session: the sticky routes it took, and how large its last
reply said the prompt was. Bounded (least recently used out): clients choose session ids.
In memory, and in Redis too when it is configured (`shared`): every process then sees it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from dragoman.routes.shared import Shared

MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Held:
    routes: set[str] = field(default_factory=set)  # sticky routes the session took
    floor: int = 0  # the highest threshold among them: threshold routes below it no longer match
    last_input: int = 0  # input + cache reads + cache writes its last reply reported


class Sessions:
    def __init__(self, size: int = MAX_SESSIONS, shared: Shared | None = None) -> None:
        self._size = size
        self._held: OrderedDict[str, Held] = OrderedDict()
        self.shared = shared

    async def fetch(self, session: str | None) -> Held | None:
        """`get`, with what other processes noted of the session merged in (when shared)."""
        if session is None or self.shared is None:
            return self.get(session)
        found = await self.shared.session(session)
        if found is None:
            return self.get(session)
        routes, floor, last = found
        held = self._entry(session)
        held.routes |= routes
        held.floor = max(held.floor, floor)
        held.last_input = last or held.last_input
        return held

    def get(self, session: str | None) -> Held | None:
        if session is None:
            return None
        held = self._held.get(session)
        if held is not None:
            self._held.move_to_end(session)
        return held

    def _entry(self, session: str) -> Held:
        held = self.get(session)
        if held is None:
            held = self._held[session] = Held()
            while len(self._held) > self._size:
                self._held.popitem(last=False)
        return held

    def took(self, session: str, route: str, threshold: int | None) -> None:
        held = self._entry(session)
        held.routes.add(route)
        if threshold is not None:
            held.floor = max(held.floor, threshold)
        if self.shared is not None:
            self.shared.took(session, route, threshold)

    def replied(self, session: str, prompt_tokens: int) -> None:
        self._entry(session).last_input = prompt_tokens
        if self.shared is not None:
            self.shared.replied(session, prompt_tokens)
