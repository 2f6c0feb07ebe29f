"""Exact prompt token counts from the upstream's own tokenizer and chat template.

vLLM renders and counts a chat request in one call (`POST /tokenize` with
`messages`); llama.cpp renders it with `POST /apply-template` and counts the
result with `POST /tokenize`. Both see the same translated request a real call
would send (system prompt, tools, tool results), so the count matches the
backend's `prompt_tokens`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import msgspec

from dragoman.core.errors import GatewayError
from dragoman.core.profiles import TokenCounter
from dragoman.protocol import openai
from dragoman.upstream.client import HttpClient
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.transport.response import Response


class _Count(msgspec.Struct):
    count: int


class _Tokens(msgspec.Struct):
    tokens: list[object]


class _Prompt(msgspec.Struct):
    prompt: str


class _ChatTokenize(msgspec.Struct, omit_defaults=True, kw_only=True):
    model: str
    messages: list[openai.ChatMessage]
    add_generation_prompt: bool  # no default, so it is always sent: the count includes the reply's header
    tools: list[openai.FunctionTool] | None = None


async def _body(http: HttpClient, response: Response) -> bytes:
    with upstream_errors(http.name):
        return await response.read()


class _Tokenize(msgspec.Struct):
    content: str
    add_special: bool = True
    parse_special: bool = True


async def count_prompt(http: HttpClient, counter: TokenCounter, chat: openai.ChatRequest) -> int:
    """Raises GatewayError when the upstream cannot count."""
    if counter == "vllm":
        body = msgspec.json.encode(
            _ChatTokenize(model=chat.model, messages=chat.messages, tools=chat.tools, add_generation_prompt=True)
        )
        response = await http.post("/tokenize", body, from_root=True)
        try:
            return msgspec.json.decode(await _body(http, response), type=_Count).count
        finally:
            response.release()
    body = msgspec.json.encode(
        {"messages": chat.messages, "tools": chat.tools} if chat.tools else {"messages": chat.messages}
    )
    response = await http.post("/apply-template", body, from_root=True)
    try:
        prompt = msgspec.json.decode(await _body(http, response), type=_Prompt).prompt
    finally:
        response.release()
    response = await http.post("/tokenize", msgspec.json.encode(_Tokenize(content=prompt)), from_root=True)
    try:
        return len(msgspec.json.decode(await _body(http, response), type=_Tokens).tokens)
    finally:
        response.release()


class CountCache:
    """Counts of identical requests, least recently used first out. Keyed by a digest of
    the model and the encoded request, not by the request: a conversation can be tens of
    MiB, and 1,024 of them held as keys would be tens of GiB (each entry is about 200 bytes)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._entries: OrderedDict[bytes, tuple[int, str]] = OrderedDict()

    @staticmethod
    def key(model: str, *encoded: bytes) -> bytes:
        digest = hashlib.blake2b(model.encode(), digest_size=32)
        for part in encoded:
            digest.update(b"\0%d\0" % len(part))  # lengths too: ("ab", "c") and ("a", "bc") differ
            digest.update(part)
        return digest.digest()

    def get(self, key: bytes) -> tuple[int, str] | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: tuple[int, str]) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


class _OllamaShow(msgspec.Struct):
    model_info: dict[str, object] = {}
    parameters: str = ""


async def ollama_context(http: HttpClient, model: str) -> int | None:
    """Ollama's context for a model (`POST /api/show`): the `num_ctx` it runs with when
    set, else the model's trained length. None when Ollama cannot say."""
    try:
        response = await http.post("/api/show", msgspec.json.encode({"model": model}), from_root=True)
        try:
            show = msgspec.json.decode(await _body(http, response), type=_OllamaShow)
        finally:
            response.release()
    except (GatewayError, msgspec.DecodeError):
        return None
    for line in show.parameters.splitlines():
        name, _, setting = line.strip().partition(" ")
        if name == "num_ctx" and setting.strip().isdigit():
            return int(setting.strip())
    for key, value in show.model_info.items():
        if key.endswith(".context_length") and isinstance(value, int):
            return value
    return None
