"""What routes see of one request, from the client's own body and headers, before anything
is dropped (the billing block) or the model name is aliased. What the core read of the body
already (decoded whole on the translating path, its `Envelope` otherwise) is used first; the
rest is read from the body once, when a condition asks (its top-level fields as raw JSON,
each decoded on demand).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from dragoman.protocol import blocks
from dragoman.protocol.anthropic import Envelope, ImageBlock, MessagesRequest, ToolResultBlock

MISSING: Any = object()  # what `body_at` finds where the path leads nowhere
SUBAGENT_HEADER = "x-claude-code-agent-id"
SESSION_HEADER = "x-claude-code-session-id"
_SUBAGENT_FLAG = re.compile(r"""cc_is_subagent["']?\s*[=:]\s*["']?true""")


class _Tool(msgspec.Struct):
    type: Any = None


class _System(msgspec.Struct):
    text: Any = None


_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TOOLS = msgspec.json.Decoder(list[_Tool])
_TYPED = frozenset({"stream", "max_tokens", "thinking", "output_config", "output_format", "metadata"})
_SYSTEM = msgspec.json.Decoder(list[_System] | str | None)
_READ = ("metadata", "thinking", "output_config", "output_format", "tool_choice")  # Shape.field, count_body
COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config")  # what a count takes
_DEFAULTED = frozenset(f.encode_name for f in msgspec.structs.fields(MessagesRequest)
                       if f.default is not None and f.default is not msgspec.NODEFAULT)  # fmt: skip
_UNKNOWN: Any = object()  # a path the decoded request cannot answer: read the body itself


def routed_envelope(names: Iterable[str]) -> type[Envelope]:
    """An `Envelope` that also keeps, undecoded, the top-level fields routes read (`names`: those
    of `body.<path>` conditions), so the core's one read of a passed-through body serves them."""
    own = {f.encode_name for f in msgspec.structs.fields(Envelope)}
    wanted = sorted({*_READ, *names} - own)
    fields = [(f"f{i}", msgspec.Raw, msgspec.field(default=msgspec.Raw(b""), name=n)) for i, n in enumerate(wanted)]
    kept = {n: f"f{i}" for i, n in enumerate(wanted)} | {"tools": "tools", "system": "system"}
    return msgspec.defstruct(  # type: ignore[return-value]  # a subclass of Envelope
        "RoutedEnvelope", fields, bases=(Envelope,), kw_only=True, gc=True, dict=True, namespace={"kept": kept}
    )  # a __dict__ (so tracked by the collector): room for `protocol.blocks.read`


class Shape:
    """One request as conditions test it. `tokens` (and `window`, the context window of the model
    the request would otherwise get) are filled in by the caller when a condition needs them."""

    __slots__ = ("_body", "_envelope", "_headers", "_parts", "_read", "_request", "effort_budgets", "model", "tokens",
                 "window")  # fmt: skip

    def __init__(self, model: str, headers: Mapping[str, str], body: bytes, effort_budgets: tuple[int, int] = (2048, 8192),
                 read: MessagesRequest | Envelope | None = None) -> None:  # fmt: skip
        self.model = model  # the name the client asked for, before aliasing
        self._headers = headers
        self._body = body
        self._request = read if isinstance(read, MessagesRequest) else None  # the body decoded whole
        self._envelope = read if isinstance(read, Envelope) else None
        self._read: dict[str, msgspec.Raw] | None = None  # the body's top-level fields, once scanned
        self._parts: dict[str, Any] = {}
        self.effort_budgets = effort_budgets
        self.tokens: int | None = None
        self.window: int | None = None

    @property
    def raw(self) -> bytes:
        """The client's body, as it came."""
        return self._body

    def header(self, name: str) -> str | None:
        return self._headers.get(name)

    @property
    def _fields(self) -> dict[str, msgspec.Raw]:
        """The body's top-level fields as raw JSON: one scan of the body, the first time."""
        if self._read is None:
            try:
                self._read = _FIELDS.decode(self._body)
            except msgspec.DecodeError:  # the pipeline decoded it already: only odd types get here
                self._read = {}
        return self._read

    def _raw_field(self, name: str) -> Any:
        """A top-level field as sent: from what the envelope kept of it, else from the body."""
        key = "." + name
        if key not in self._parts:
            kept = getattr(self._envelope, "kept", None)
            if kept is not None and name in kept:
                raw = getattr(self._envelope, kept[name]) or None  # an absent field is an empty Raw
            else:
                raw = self._fields.get(name)
            self._parts[key] = MISSING if raw is None else _decoded(raw)
        return self._parts[key]

    def field(self, name: str) -> Any:
        """A top-level field, decoded (MISSING when absent)."""
        parts = self._parts
        if name in parts:
            return parts[name]
        if self._request is not None and name in _TYPED:
            value = getattr(self._request, name)
            value = MISSING if value is None else msgspec.to_builtins(value)
        elif self._envelope is not None and name in ("stream", "max_tokens"):
            value = getattr(self._envelope, name)
        else:
            value = self._raw_field(name)
        parts[name] = value
        return value

    @property
    def stream(self) -> bool:
        return self.field("stream") is True

    @property
    def max_tokens(self) -> int:
        value = self.field("max_tokens")
        return value if isinstance(value, int) else 0

    @property
    def tool_types(self) -> list[Any]:
        types = self._parts.get(" tools")
        if types is None and self._request is not None:
            types = self._parts[" tools"] = [tool.type for tool in self._request.tools or ()]
        if types is None:
            raw = self._envelope.tools if self._envelope is not None else self._fields.get("tools")
            raw = raw if raw else None  # an envelope without tools holds an empty Raw
            try:
                types = [t.type for t in _TOOLS.decode(raw)] if raw is not None else []
            except msgspec.ValidationError:
                types = []
            self._parts[" tools"] = types
        return types

    @property
    def server_tools(self) -> list[str]:
        """The types of the request's server tools (web_search_20250305, ...): every typed tool but `custom`."""
        return [kind for kind in self.tool_types if isinstance(kind, str) and kind != "custom"]

    @property
    def output_format(self) -> str | None:
        for holder in (self.field("output_config"), {"format": self.field("output_format")}):
            if isinstance(holder, dict) and isinstance(holder.get("format"), dict):
                kind = holder["format"].get("type")
                return kind if isinstance(kind, str) else None
        return None

    @property
    def thinking_on(self) -> bool:
        thinking = self.field("thinking")
        return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")

    @property
    def budget(self) -> int | None:
        thinking = self.field("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        return budget if isinstance(budget, int) and thinking.get("type") == "enabled" else None  # type: ignore[union-attr]

    @property
    def effort(self) -> str | None:
        """`output_config.effort`, else the effort a `budget_tokens` stands for (server.effort_budgets)."""
        config = self.field("output_config")
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
        if self._request is not None:
            system: Any = self._request.system
        else:
            raw = self._envelope.system if self._envelope is not None else self._fields.get("system")
            try:
                system = _SYSTEM.decode(raw) if raw else None
            except msgspec.ValidationError:
                return False
        text = system[0].text if isinstance(system, list) and system else None
        return (
            isinstance(text, str)
            and text.startswith("x-anthropic-billing-header")
            and bool(_SUBAGENT_FLAG.search(text))
        )

    @property
    def images(self) -> bool:
        """Whether any message holds an image block, tool results included."""
        found = self._parts.get(" images")
        if found is None:
            if self._request is not None:
                found = any(_typed_image(message.content) for message in self._request.messages)
            else:
                try:  # an odd shape the pipeline let through: no image that we can see
                    found = blocks.has_image(blocks.read(self._envelope) if self._envelope is not None
                                             else blocks.MESSAGES.decode(self._body).messages)  # fmt: skip
                except msgspec.DecodeError:
                    found = False
            self._parts[" images"] = found
        return found

    @property
    def session(self) -> str | None:
        """Claude Code's session: its header, else `metadata.user_id` (JSON, or the older `..._session_<id>`)."""
        header = self._headers.get(SESSION_HEADER)
        if header:
            return header
        metadata = self.field("metadata")
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
        fields = self._fields
        return max(1, sum(len(fields[k]) for k in ("messages", "system", "tools") if k in fields) // 4)

    def fits(self) -> bool:
        """Input plus max_tokens within the window (True when the window is unknown)."""
        return self.window is None or self.tokens is None or self.tokens + self.max_tokens <= self.window

    def count_body(self) -> bytes:
        """The body of a passed-through count: the counted fields as sent (no max_tokens, which
        Anthropic's count refuses), spliced from the envelope's parts when it kept them."""
        kept = getattr(self._envelope, "kept", None)
        if kept is None:
            whole = self.body_at(())
            return msgspec.json.encode({k: v for k, v in whole.items() if k in COUNTED and v is not MISSING})
        envelope: Any = self._envelope
        parts = [b'"model":' + msgspec.json.encode(envelope.model),
                 b'"messages":[' + b",".join(bytes(m) for m in envelope.messages) + b"]"]  # fmt: skip
        for name in COUNTED[2:]:
            raw = getattr(envelope, kept[name])
            if raw:
                parts.append(msgspec.json.encode(name) + b":" + bytes(raw))
        return b"{" + b",".join(parts) + b"}"

    def body_at(self, path: tuple[str | int, ...]) -> Any:
        """The body's value at a dotted path (numbers index lists), or MISSING (a JSON null too)."""
        if not path:
            return {name: self._raw_field(name) for name in self._fields}
        value = _UNKNOWN if self._request is None else _typed_at(self._request, path)
        if value is _UNKNOWN:  # as sent: a struct the core decoded keeps only its own fields
            value = _walk(self._raw_field(str(path[0])), path[1:])
        return MISSING if value is None else value


def _walk(value: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
            value = value[step]
        elif isinstance(value, dict) and str(step) in value:
            value = value[str(step)]
        else:
            return MISSING
    return value


def _typed_at(request: MessagesRequest, path: tuple[str | int, ...]) -> Any:
    """The value at `path` in the decoded request, or _UNKNOWN where it may differ from the body:
    a field it does not declare (dropped), a whole struct (its unknown keys dropped), a default."""
    if path[0] in _DEFAULTED:
        return _UNKNOWN
    value: Any = request
    for at, step in enumerate(path):
        if value is None:
            return MISSING
        if isinstance(value, msgspec.Struct):
            names = value.__struct_encode_fields__
            if step not in names:
                return _UNKNOWN
            value = getattr(value, value.__struct_fields__[names.index(step)])
        else:
            value = _walk(value, path[at : at + 1])
            if value is MISSING:
                return MISSING
    if isinstance(value, msgspec.Struct) or (
        isinstance(value, list) and any(isinstance(v, msgspec.Struct) for v in value)
    ):
        return _UNKNOWN
    return value


def _decoded(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _typed_image(content: Any) -> bool:
    for block in content if isinstance(content, list) else ():
        if isinstance(block, ImageBlock):
            return True
        if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
            if any(isinstance(inner, ImageBlock) for inner in block.content):
                return True
    return False
