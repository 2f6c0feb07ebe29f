"""What routes see of one request: its top fields read once, the rest (messages, tools,
system, any body path) decoded only when a condition asks. Read from the client's own body
and headers, before anything is dropped (the billing block) or the model name is aliased.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

MISSING: Any = object()  # what `body_at` finds where the path leads nowhere
SUBAGENT_HEADER = "x-claude-code-agent-id"
SESSION_HEADER = "x-claude-code-session-id"
_SUBAGENT_FLAG = re.compile(r"""cc_is_subagent["']?\s*[=:]\s*["']?true""")


class _Top(msgspec.Struct):
    model: str = ""
    stream: Any = False
    max_tokens: Any = 0
    messages: msgspec.Raw = msgspec.Raw(b"")
    system: msgspec.Raw = msgspec.Raw(b"")
    tools: msgspec.Raw = msgspec.Raw(b"")
    thinking: Any = None
    output_config: Any = None
    output_format: Any = None
    metadata: Any = None


class _Tool(msgspec.Struct):
    type: Any = None


_TOP = msgspec.json.Decoder(_Top)
_TOOLS = msgspec.json.Decoder(list[_Tool])
_EMPTY = _Top()


class Shape:
    """One request as conditions test it. `tokens` (and `window`, the context window of the model
    the request would otherwise get) are filled in by the caller when a condition needs them."""

    __slots__ = ("_body", "_headers", "_parts", "_top", "_whole", "effort_budgets", "model", "tokens", "window")

    def __init__(self, model: str, headers: Mapping[str, str], body: bytes,
                 effort_budgets: tuple[int, int] = (2048, 8192)) -> None:  # fmt: skip
        self.model = model  # the name the client asked for, before aliasing
        self._headers = headers
        self._body = body
        try:
            self._top = _TOP.decode(body)
        except msgspec.DecodeError:  # the pipeline decoded it already: only odd types get here
            self._top = _EMPTY
        self._parts: dict[str, Any] = {}
        self._whole: Any = MISSING
        self.effort_budgets = effort_budgets
        self.tokens: int | None = None
        self.window: int | None = None

    def header(self, name: str) -> str | None:
        return self._headers.get(name)

    @property
    def stream(self) -> bool:
        return self._top.stream is True

    @property
    def max_tokens(self) -> int:
        value = self._top.max_tokens
        return value if isinstance(value, int) else 0

    @property
    def tool_types(self) -> list[Any]:
        types = self._parts.get("tools")
        if types is None:
            raw = bytes(self._top.tools)
            try:
                types = [t.type for t in _TOOLS.decode(raw)] if raw and raw != b"null" else []
            except msgspec.DecodeError:
                types = []
            self._parts["tools"] = types
        return types

    @property
    def server_tools(self) -> list[str]:
        """The types of the request's server tools (web_search_20250305, ...): every typed tool but `custom`."""
        return [kind for kind in self.tool_types if isinstance(kind, str) and kind != "custom"]

    @property
    def output_format(self) -> str | None:
        for holder in (self._top.output_config, {"format": self._top.output_format}):
            if isinstance(holder, dict) and isinstance(holder.get("format"), dict):
                kind = holder["format"].get("type")
                return kind if isinstance(kind, str) else None
        return None

    @property
    def thinking_on(self) -> bool:
        thinking = self._top.thinking
        return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")

    @property
    def budget(self) -> int | None:
        thinking = self._top.thinking
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        return budget if isinstance(budget, int) and thinking.get("type") == "enabled" else None  # type: ignore[union-attr]

    @property
    def effort(self) -> str | None:
        """`output_config.effort`, else the effort a `budget_tokens` stands for (server.effort_budgets)."""
        config = self._top.output_config
        if isinstance(config, dict) and isinstance(config.get("effort"), str):
            return config["effort"]
        budget = self.budget
        if budget is None:
            return None
        low, medium = self.effort_budgets
        return "low" if budget <= low else "medium" if budget <= medium else "high"

    @property
    def subagent(self) -> bool:
        """Claude Code's subagent requests: its agent header, or the billing block's flag."""
        if self._headers.get(SUBAGENT_HEADER):
            return True
        raw = bytes(self._top.system)
        if b"cc_is_subagent" not in raw:
            return False
        try:
            system = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return False
        first = system[0] if isinstance(system, list) and system else None
        text = first.get("text") if isinstance(first, dict) else None
        return (
            isinstance(text, str)
            and text.startswith("x-anthropic-billing-header")
            and bool(_SUBAGENT_FLAG.search(text))
        )

    @property
    def images(self) -> bool:
        """Whether any message holds an image block, tool results included."""
        found = self._parts.get("images")
        if found is None:
            raw = bytes(self._top.messages)
            found = b'"image"' in raw and _has_image(_decoded(raw))
            self._parts["images"] = found
        return found

    @property
    def session(self) -> str | None:
        """Claude Code's session: its header, else `metadata.user_id` (JSON, or the older `..._session_<id>`)."""
        header = self._headers.get(SESSION_HEADER)
        if header:
            return header
        metadata = self._top.metadata
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
        if not isinstance(user, str) or not user:
            return None
        if user.startswith("{"):
            try:
                session = json.loads(user).get("session_id")
            except (ValueError, AttributeError):
                session = None
            return session if isinstance(session, str) and session else user
        return user.rpartition("_session_")[2] or user

    def estimate(self) -> int:
        """About four bytes a token over the prompt's parts: when nothing can count them."""
        top = self._top
        return max(1, (len(top.messages) + len(top.system) + len(top.tools)) // 4)

    def fits(self) -> bool:
        """Input plus max_tokens within the window (True when the window is unknown)."""
        return self.window is None or self.tokens is None or self.tokens + self.max_tokens <= self.window

    def body_at(self, path: tuple[str | int, ...]) -> Any:
        """The body's value at a dotted path (numbers index lists), or MISSING."""
        if self._whole is MISSING:
            self._whole = _decoded(self._body)
        value = self._whole
        for step in path:
            if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
                value = value[step]
            elif isinstance(value, dict) and str(step) in value:
                value = value[str(step)]
            else:
                return MISSING
        return value


def _decoded(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None


def _has_image(messages: Any) -> bool:
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "image":
                return True
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in inner):
                return True
    return False
