"""What routes see of one request, from the client's own body and headers, before anything
is dropped (the billing block) or the model name is aliased. What the core read of the body
already (decoded whole on the translating path, its `Envelope` otherwise) is used first; the
rest is read from the body once, when a condition asks (its top-level fields as raw JSON,
each decoded on demand). Each fact is read once (`reading.once`), the first time a condition
asks for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from dragoman.protocol import blocks
from dragoman.protocol.anthropic import Envelope, ImageBlock, MessagesRequest, ToolResultBlock
from dragoman.routes.reading import (
    SESSION_HEADER,
    SUBAGENT_HEADER,
    Reader,
    Split,
    SystemRead,
    ToolsRead,
    facts_of,
    flagged,
    flagged_read,
    flagged_split,
    once,
    picked,
)

MISSING: Any = object()  # what `body_at` finds where the path leads nowhere
READER = Reader()  # a shape's without a table: nothing kept between requests
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ENCODE = msgspec.json.Encoder().encode
_TYPED = frozenset({"thinking", "output_config", "output_format", "metadata"})
_READ = ("metadata", "thinking", "output_config", "output_format", "tool_choice")  # Shape.field, count_body
COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config")  # what a count takes
_SPLICED = tuple((name, b',"' + name.encode() + b'":') for name in COUNTED[2:])
_DEFAULTED = frozenset(f.encode_name for f in msgspec.structs.fields(MessagesRequest)
                       if f.default is not None and f.default is not msgspec.NODEFAULT)  # fmt: skip
_UNKNOWN: Any = object()  # a path the decoded request cannot answer: read the body itself


def routed_envelope(names: Iterable[str], facts: bool = False, split: bool = False) -> type[Envelope]:
    """An `Envelope` that also keeps, undecoded, the top-level fields routes read (`names`: those
    of `body.<path>` conditions), so the core's one read of a passed-through body serves them.
    `facts`: its tools and system prompt are read in that same pass into what conditions ask of
    them (`reading.ToolsRead`, `SystemRead`), not kept as sent: for a table none of whose routes
    needs their bytes (a count's body) nor any upstream (cache-aware placement), where reading
    them apart from the envelope costs a second pass over 15 KB of tools (about 5 µs).
    `split`: its system prompt read in that pass into blocks of values as sent (`reading.Split`),
    for a counting table: the billing flag and a count's body from one pass."""
    own = {f.encode_name for f in msgspec.structs.fields(Envelope)}
    wanted = sorted({*_READ, *names} - own)
    fields: list[Any] = [(f"f{i}", msgspec.Raw, msgspec.field(default=msgspec.Raw(b""), name=n))
                         for i, n in enumerate(wanted)]  # fmt: skip
    kept = {n: f"f{i}" for i, n in enumerate(wanted)}
    split = split and not facts
    if facts:
        fields += [("tools", ToolsRead, None), ("system", SystemRead, None)]
    else:
        kept["tools"] = "tools"
    if split:  # absent: UNSET, where a `null` sent is None
        fields.append(("system", Split | msgspec.UnsetType, msgspec.UNSET))
    elif not facts:
        kept["system"] = "system"
    return msgspec.defstruct(  # type: ignore[return-value]  # a subclass of Envelope
        "RoutedEnvelope",
        fields,
        bases=(Envelope,),
        kw_only=True,
        gc=True,
        dict=True,
        namespace={"kept": kept, "facts": facts, "split": split},
    )  # a __dict__ (so tracked by the collector): room for `protocol.blocks.read`


class Shape:
    """One request as conditions test it. `tokens` (and `window`, the context window of the model
    the request would otherwise get) are filled in by the caller when a condition needs them.
    `reader`: the table's (the headers its conditions read, what it kept of earlier requests)."""

    def __init__(self, model: str, headers: Mapping[str, str], body: bytes,
                 read: MessagesRequest | Envelope | None = None, reader: Reader = READER) -> None:  # fmt: skip
        self.model = model  # the name the client asked for, before aliasing
        self._headers = headers
        self._reader = reader
        self._seen: dict[str, str | None] | None = None  # the headers looked up
        self._body = body
        self._request = read if isinstance(read, MessagesRequest) else None  # the body decoded whole
        self._envelope = read if isinstance(read, Envelope) else None
        self._kept: dict[str, str] | None = getattr(read, "kept", None)  # a routed envelope's fields
        self._facts: bool = getattr(read, "facts", False)  # its tools and system read for their facts
        self._split: bool = getattr(read, "split", False)  # its system prompt read as `reading.Split`
        self._read: dict[str, msgspec.Raw] | None = None  # the body's top-level fields, once scanned
        self._parts: dict[Any, Any] = {}
        self.tokens: int | None = None
        self.window: int | None = None
        self.answer: Any = None  # a `count_tokens` request's upstream answer, when routing asked for it
        if read is not None:  # both reads hold these (`stream`, `max_tokens` below read the body)
            self.stream = read.stream is True
            self.max_tokens = read.max_tokens if isinstance(read.max_tokens, int) else 0

    @property
    def raw(self) -> bytes:
        """The client's body, as it came."""
        return self._body

    @property
    def envelope(self) -> Envelope | None:
        """What the core read of a passed-through body (None when it decoded it whole)."""
        return self._envelope

    def header(self, name: str) -> str | None:
        seen = self._seen
        if seen is None:
            seen = self._seen = picked(self._headers, self._reader.header_names)
        found = seen.get(name, MISSING)
        if found is MISSING:  # a name no condition declared
            found = seen[name] = self._headers.get(name)
        return found  # type: ignore[no-any-return]

    @property
    def _fields(self) -> dict[str, msgspec.Raw]:
        """The body's top-level fields as raw JSON: one scan of the body, the first time."""
        if self._read is None:
            try:
                self._read = _FIELDS.decode(self._body)
            except msgspec.DecodeError:  # the pipeline decoded it already: only odd types get here
                self._read = {}
        return self._read

    def _part(self, name: str) -> Any:
        """A top-level field as sent, undecoded: what the envelope kept of it, else from the body (None: absent)."""
        kept = self._kept
        if kept is not None and name in kept:
            return getattr(self._envelope, kept[name]) or None  # an absent field is an empty Raw
        return self._fields.get(name)

    def _raw_field(self, name: str) -> Any:
        """A top-level field as sent, decoded (MISSING when absent)."""
        key = "." + name
        found = self._parts.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            raw = self._part(name)
            found = self._parts[key] = MISSING if raw is None else _decoded(raw)
        return found

    def field(self, name: str) -> Any:
        """A top-level field, decoded (MISSING when absent)."""
        parts = self._parts
        found = parts.get(name, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        if self._request is not None and name in _TYPED:
            found = getattr(self._request, name)
            found = MISSING if found is None else msgspec.to_builtins(found)
        else:
            found = self._raw_field(name)
        parts[name] = found
        return found

    @once
    def stream(self) -> bool:  # read from the body: the core read none of it
        return self.field("stream") is True

    @once
    def max_tokens(self) -> int:
        value = self.field("max_tokens")
        return value if isinstance(value, int) else 0

    @once
    def tool_facts(self) -> tuple[int, list[str]]:
        """How many tools, and the server tools' types (web_search_20250305, ...: every typed tool
        but `custom`); from a passed-through body's tools, read without their schemas, once per
        distinct bytes (`Reader.tools`). Conditions read both from this one fact."""
        request = self._request
        if request is not None:
            tools = request.tools or ()
            return len(tools), [tool.type for tool in tools if tool.type is not None and tool.type != "custom"]
        if self._facts:
            return facts_of(self._envelope.tools)  # type: ignore[union-attr]
        raw = self._envelope.tools if self._envelope is not None else self._fields.get("tools")
        if not raw:  # an envelope without tools holds an empty Raw
            return 0, []
        return self._reader.tools(raw)

    @property
    def tool_count(self) -> int:
        return self.tool_facts[0]

    @property
    def server_tools(self) -> list[str]:
        return self.tool_facts[1]

    @once
    def output_format(self) -> str | None:
        """The structured output's type: `output_config.format`'s, else the older `output_format`'s."""
        request = self._request
        if request is not None:
            config = request.output_config
            held = config.format if config is not None and config.format is not None else request.output_format
            return held.type if held is not None else None
        if self._part("output_config") is None and self._part("output_format") is None:
            return None  # neither sent (the common case): nothing to decode
        for holder in (self.field("output_config"), {"format": self.field("output_format")}):
            if isinstance(holder, dict) and isinstance(holder.get("format"), dict):
                kind = holder["format"].get("type")
                return kind if isinstance(kind, str) else None
        return None

    @once
    def thinking_on(self) -> bool:
        if self._request is not None:
            return self._request.thinking is not None and self._request.thinking.type in ("enabled", "adaptive")
        if self._part("thinking") is None:
            return False
        thinking = self.field("thinking")
        return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")

    @once
    def budget(self) -> int | None:
        if self._request is not None:
            config = self._request.thinking
            return config.budget_tokens if config is not None and config.type == "enabled" else None
        thinking = self.field("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        return budget if isinstance(budget, int) and thinking.get("type") == "enabled" else None  # type: ignore[union-attr]

    @once
    def effort(self) -> str | None:
        """`output_config.effort`, else the effort a `budget_tokens` stands for (server.effort_budgets)."""
        if self._request is not None:
            config = self._request.output_config
            effort = config.effort if config is not None else None
        else:
            config = self.field("output_config")
            effort = config.get("effort") if isinstance(config, dict) else None
        if isinstance(effort, str):
            return effort
        budget = self.budget
        if budget is None:
            return None
        low, medium = self._reader.effort_budgets
        return "low" if budget <= low else "medium" if budget <= medium else "high"

    @once
    def subagent(self) -> bool:
        """Claude Code's subagent requests: its agent header, or the billing block's flag."""
        if self.header(SUBAGENT_HEADER):
            return True
        if self._request is not None:
            system = self._request.system
            return isinstance(system, list) and bool(system) and flagged(system[0].text)
        if self._facts:
            return flagged_read(self._envelope.system)  # type: ignore[union-attr]
        if self._split:
            return flagged_split(self._envelope.system)  # type: ignore[union-attr]
        raw = self._envelope.system if self._envelope is not None else self._fields.get("system")
        return self._reader.subagent(raw) if raw else False

    @once
    def images(self) -> bool:
        """Whether any message holds an image block, tool results included."""
        if self._request is not None:
            return _typed_image(self._request.messages)
        # an odd shape the pipeline let through: no image that we can see
        return (blocks.read(self._envelope) if self._envelope is not None else blocks.read_body(self._body)).images

    @property
    def session(self) -> str | None:
        """Claude Code's session: its header, else `metadata.user_id` (JSON, or the older `..._session_<id>`)."""
        header = self.header(SESSION_HEADER)
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
        kept = self._kept
        if kept is None or self._facts:  # not read, or read for their facts alone
            whole = self.body_at(())
            return msgspec.json.encode({k: v for k, v in whole.items() if k in COUNTED and v is not MISSING})
        envelope: Any = self._envelope
        parts: list[Any] = [b'{"model":', msgspec.json.encode(envelope.model), b',"messages":[']
        for message in envelope.messages:  # Raw views into the body: copied once, by the join
            parts += (message, b",")
        if envelope.messages:
            parts[-1] = b"]"  # in place of the last comma
        else:
            parts.append(b"]")
        for name, key in _SPLICED:
            if name in kept:
                raw = getattr(envelope, kept[name])
                if raw:
                    parts += (key, raw)
            elif (value := getattr(envelope, name)) is not msgspec.UNSET:  # read as `Split`: the same JSON
                parts += (key, _ENCODE(value))
        parts.append(b"}")
        return b"".join(parts)

    def body_at(self, path: tuple[str | int, ...]) -> Any:
        """The body's value at a dotted path (numbers index lists), or MISSING (a JSON null too)."""
        found = self._parts.get(path, _UNKNOWN)  # a tuple: no field's key
        if found is not _UNKNOWN:
            return found
        if not path:
            found = {name: self._raw_field(name) for name in self._fields}
        else:
            found = _UNKNOWN if self._request is None else _typed_at(self._request, path)
            if found is _UNKNOWN:  # as sent: a struct the core decoded keeps only its own fields
                found = _walk(self._raw_field(str(path[0])), path[1:])
            found = MISSING if found is None else found
        self._parts[path] = found
        return found


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


def _typed_image(messages: list[Any]) -> bool:
    for message in messages:
        content = message.content
        if isinstance(content, str):
            continue
        for block in content:
            kind = type(block)  # neither type has subclasses: `is`, where isinstance walks the MRO
            if kind is ImageBlock:
                return True
            if kind is ToolResultBlock and isinstance(block.content, list):
                for inner in block.content:
                    if type(inner) is ImageBlock:
                        return True
    return False
