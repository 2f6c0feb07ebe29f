"""What the loop runs: one `Runner` per server tool of a request, offered to the model as a
function, giving the client's blocks and the model's text for each call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dragoman.protocol import anthropic as a


@dataclass(slots=True)
class Tally:
    """What the server tools of one request did: the usage counts and one (tool, provider,
    outcome) per run, for the metric."""

    web_search_requests: int = 0
    web_fetch_requests: int = 0
    runs: list[tuple[str, str, str]] = field(default_factory=list)

    def usage(self) -> dict[str, int]:
        return {"web_search_requests": self.web_search_requests, "web_fetch_requests": self.web_fetch_requests}


@dataclass(frozen=True, slots=True)
class Result:
    block: a.ContentBlock  # the client's result block
    text: str  # what the model is handed
    is_error: bool = False


class Runner(Protocol):
    @property
    def function(self) -> a.Tool:
        """The function the model is offered (a custom tool: name, description, schema)."""
        ...

    def new_id(self) -> str: ...

    def use_block(self, call_id: str, arguments: Any) -> a.ContentBlock:
        """The client's block for a call (`server_tool_use`, `mcp_tool_use`)."""
        ...

    async def run(self, call_id: str, arguments: Any) -> Result: ...
