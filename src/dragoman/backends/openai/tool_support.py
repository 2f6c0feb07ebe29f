"""Whether a model's chat template shows it the tools a request sends.

A template with no place for tools (SmolLM2's, and many small models') renders the
prompt as if there were none: the server accepts the request, the model never sees the
tools, and a client such as Claude Code only seems to work. llama.cpp says so itself
(`GET /props`: `chat_template_caps.supports_tools`, from its template analysis); where
the server can count a prompt (vLLM's and llama.cpp's tokenizers), a prompt with a tool
that counts no more tokens than the same prompt without it tells the same. Anything
else cannot be told from outside: None.
"""

from __future__ import annotations

import asyncio

import msgspec

from dragoman.backends.openai.counting import count_prompt
from dragoman.core.errors import GatewayError
from dragoman.core.profiles import Profile
from dragoman.protocol import openai
from dragoman.upstream.client import HttpClient

PROBE_TOOL = openai.FunctionTool(
    function=openai.FunctionDef(
        name="dragoman_probe",
        description="Whether the chat template renders tools.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}},
    )
)


class _Caps(msgspec.Struct):
    supports_tools: bool | None = None


class _Props(msgspec.Struct):
    chat_template_caps: _Caps | None = None


class _Tools(msgspec.Struct):
    tools: list[msgspec.Raw] | None = None


def sends_tools(body: bytes) -> bool:
    """Whether a Messages request body (as the client sent it) has tools."""
    if b'"tools"' not in body:
        return False
    try:
        return bool(msgspec.json.decode(body, type=_Tools).tools)
    except msgspec.DecodeError:
        return False


PROBE_TIMEOUT = 5.0  # seconds: discovery does not wait longer for the answer


async def renders_tools(http: HttpClient, profile: Profile, model: str) -> bool | None:
    """True or False when the server can tell (within PROBE_TIMEOUT), else None."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            return await _renders_tools(http, profile, model)
    except TimeoutError:
        return None


async def _renders_tools(http: HttpClient, profile: Profile, model: str) -> bool | None:
    if profile.token_counter == "llamacpp":
        said = await llamacpp_renders_tools(http)
        if said is not None:
            return said
    if profile.token_counter is None:
        return None
    messages: list[openai.ChatMessage] = [openai.UserMessage(content="Hello")]
    try:
        without = await count_prompt(http, profile.token_counter, openai.ChatRequest(model=model, messages=messages))
        tooled = openai.ChatRequest(model=model, messages=messages, tools=[PROBE_TOOL])
        return await count_prompt(http, profile.token_counter, tooled) > without
    except (GatewayError, msgspec.DecodeError):
        return None


async def llamacpp_renders_tools(http: HttpClient) -> bool | None:
    """What llama-server's `GET /props` says of its template's tools (None: it does not say)."""
    try:
        status, body = await http.get("/props", from_root=True)
        if status != 200:
            return None
        props = msgspec.json.decode(body, type=_Props)
    except (GatewayError, msgspec.DecodeError):
        return None
    return props.chat_template_caps.supports_tools if props.chat_template_caps else None
