"""How `shape.Shape` reads a request at the least cost: each fact once (`once`), the headers
conditions name in one pass (`picked`), and a passed-through body's large parts (its tools,
its system prompt) once per distinct bytes (`Reader`, with the table's `memo.Memo`s).
A pure module: no I/O, and nothing of dragoman's imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import msgspec

from dragoman.routes.memo import Memo

SUBAGENT_HEADER = "x-claude-code-agent-id"
SESSION_HEADER = "x-claude-code-session-id"
BILLING = "x-anthropic-billing-header"  # Claude Code's first system block
SUBAGENT_FLAG = re.compile(r"""cc_is_subagent["']?\s*[=:]\s*["']?true""")
T = TypeVar("T")


class _Tool(msgspec.Struct, gc=False):  # untracked by the collector: a string, or JSON (no cycle back)
    type: Any = None


class _System(msgspec.Struct):
    text: msgspec.Raw = msgspec.Raw(b"null")  # decoded for the first block alone


_TOOLS = msgspec.json.Decoder(list[_Tool])
_SYSTEM = msgspec.json.Decoder(list[_System] | str | None)
# Any JSON at all, as an envelope reading the tools or the system prompt in its own pass decodes it
# (`shape.routed_envelope`): a malformed part must not fail the read, only have no facts.
_Scalar = str | int | float | bool | None
ToolsRead = list[_Tool | _Scalar | list[Any]] | dict[str, Any] | _Scalar
SystemRead = list[_System | _Scalar | list[Any]] | dict[str, Any] | _Scalar
# A counting table's read of the system prompt in the envelope's pass: each block's keys, their
# values as sent (`Raw`, no copy). Its flag at a look-up; a count's body holds it re-encoded as
# the same JSON (`shape.Shape.count_body`), where a read apart from its bytes costs a second pass.
Split = list[dict[str, msgspec.Raw] | _Scalar | list[Any]] | dict[str, Any] | _Scalar


def tool_facts(raw: msgspec.Raw) -> tuple[int, list[str]]:
    """What conditions ask of the tools array `raw`, its schemas skipped: how many, and the
    server tools' types (every typed tool but `custom`); none when it is not a list of objects.
    Shared by every request that sends the same bytes: never changed."""
    try:
        tools = _TOOLS.decode(raw)
    except msgspec.ValidationError:
        return 0, []
    kinds = [kind for tool in tools if (kind := tool.type) is not None]  # most have none: the loop keeps the others
    return len(tools), [kind for kind in kinds if isinstance(kind, str) and kind != "custom"]


def facts_of(tools: Any) -> tuple[int, list[str]]:
    """`tool_facts` of the tools decoded as `ToolsRead` (what `_TOOLS` refuses has none)."""
    if not isinstance(tools, list):
        return 0, []
    try:  # most tools have no type: the loop keeps the others
        kinds = [kind for tool in tools if (kind := tool.type) is not None]
    except AttributeError:  # a JSON value but an object: no `type` attribute
        return 0, []
    return len(tools), [kind for kind in kinds if isinstance(kind, str) and kind != "custom"]


def flagged_split(system: Any) -> bool:
    """`flagged_system` of the system prompt decoded as `Split`."""
    first = _first_block(system, dict)
    text = None if first is None else first.get("text")
    return text is not None and flagged(msgspec.json.decode(text))


def flagged_read(system: Any) -> bool:
    """`flagged_system` of the system prompt decoded as `SystemRead`."""
    first = _first_block(system, _System)
    return first is not None and flagged(msgspec.json.decode(first.text))


def _first_block(system: Any, kind: type) -> Any:
    """The first block of a system prompt read as a list of `kind`; None when it is not one."""
    if not isinstance(system, list) or not system:
        return None
    for block in system:
        if type(block) is not kind:  # a JSON value but an object
            return None
    return system[0]


def flagged(text: Any) -> bool:
    """Whether a first system block's text is the billing block with `cc_is_subagent=true`."""
    return isinstance(text, str) and text.startswith(BILLING) and bool(SUBAGENT_FLAG.search(text))


def flagged_system(raw: msgspec.Raw) -> bool:
    """`flagged`, of the system prompt `raw` as sent (only its first block's text decoded)."""
    try:
        system = _SYSTEM.decode(raw)
        return isinstance(system, list) and bool(system) and flagged(msgspec.json.decode(system[0].text))
    except msgspec.DecodeError:
        return False


@dataclass(frozen=True, slots=True)
class Reader:
    """What a route table gives every shape it reads."""

    effort_budgets: tuple[int, int] = (2048, 8192)  # server.effort_budgets
    header_names: Mapping[bytes, str] = field(default_factory=dict)  # from `header_names`
    tools: Callable[[msgspec.Raw], tuple[int, list[str]]] = tool_facts  # of a passed-through body
    subagent: Callable[[msgspec.Raw], bool] = flagged_system

    @classmethod
    def table(cls, effort_budgets: tuple[int, int], headers: Iterable[str]) -> Reader:
        """A table's: its headers, and what it read of the last requests' tools and system prompts."""
        return cls(effort_budgets, header_names(headers), Memo(tool_facts), Memo(flagged_system))


def header_names(names: Iterable[str]) -> dict[bytes, str]:
    """The headers a route table reads (`names`, lowercase, and those a shape reads itself)."""
    return {name.encode("latin-1"): name for name in sorted({*names, SUBAGENT_HEADER, SESSION_HEADER})}


def picked(headers: Mapping[str, str], names: Mapping[bytes, str]) -> dict[str, str | None]:
    """The headers `names` lists (None for those absent), in one pass over the ASGI list when
    there is one (Starlette's `Headers.raw`): a lookup there costs a scan, and a miss an exception."""
    found: dict[str, str | None] = dict.fromkeys(names.values())
    raw = getattr(headers, "raw", None)
    if found and isinstance(raw, list):
        for key, value in raw:
            name = names.get(key)
            if name is not None and found[name] is None:  # the first one, as `Headers.get`
                found[name] = value.decode("latin-1")
    else:
        for name in found:
            found[name] = headers.get(name)
    return found


class once(Generic[T]):  # noqa: N801  # used as a decorator, like `property`
    """A fact of the request, computed the first time a condition asks for it, then a plain
    attribute of the shape (the next route's condition reads it at the cost of a dict lookup)."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    @overload
    def __get__(self, shape: None, owner: type) -> once[T]: ...

    @overload
    def __get__(self, shape: object, owner: type | None = None) -> T: ...

    def __get__(self, shape: object, owner: type | None = None) -> T | once[T]:
        if shape is None:
            return self
        value = shape.__dict__[self.name] = self.compute(shape)
        return value
