"""OpenAI Chat Completions wire types: only the subset we send and read.

Response types are lenient on purpose: every backend (vLLM, SGLang, llama.cpp,
Ollama, hosted APIs) adds its own fields and leaves out others, so everything a
backend may omit has a default.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct


class _Out(Struct, kw_only=True, omit_defaults=True, gc=False):
    """Base for what we send upstream: unset optional fields are not sent. Wire types are
    plain trees, never cycles: the garbage collector need not track them (`gc=False`)."""


class TextPart(_Out, tag="text", tag_field="type"):
    text: str


class ImageURL(_Out):
    url: str


class ImagePart(_Out, tag="image_url", tag_field="type"):
    image_url: ImageURL


Part = TextPart | ImagePart


class FunctionCall(_Out):
    name: str
    arguments: str


class ToolCall(_Out, tag="function", tag_field="type"):
    """A tagged struct, so `"type": "function"` is always sent (servers require it)."""

    id: str
    function: FunctionCall


class SystemMessage(_Out, tag="system", tag_field="role"):
    content: str


class UserMessage(_Out, tag="user", tag_field="role"):
    content: str | list[Part]


class AssistantMessage(_Out, tag="assistant", tag_field="role"):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ToolMessage(_Out, tag="tool", tag_field="role"):
    tool_call_id: str
    content: str


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class FunctionDef(_Out):
    name: str
    parameters: dict[str, Any] | msgspec.Raw
    description: str | None = None
    strict: bool | None = None


class FunctionTool(_Out, tag="function", tag_field="type"):
    function: FunctionDef


class StreamOptions(_Out):
    include_usage: bool  # required: omit_defaults would drop a default True


class ChatRequest(_Out):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] | None = None
    user: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    # vLLM and SGLang extensions, sent only when the backend profile asks for them.
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# -- responses ----------------------------------------------------------------


class _In(Struct, kw_only=True, gc=False):
    """Base for what backends send back (untracked by the garbage collector, as `_Out`)."""


class PromptTokensDetails(_In):
    cached_tokens: int | None = None


class CompletionTokensDetails(_In):
    reasoning_tokens: int | None = None


class Usage(_In):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class ResponseFunction(_In):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class ResponseToolCall(_In):
    index: int | None = None
    id: str | None = None
    function: ResponseFunction | None = None


class ResponseMessage(_In):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ResponseToolCall] | None = None
    refusal: str | None = None


class Choice(_In):
    index: int = 0
    message: ResponseMessage = msgspec.field(default_factory=ResponseMessage)
    finish_reason: str | None = None


class ErrorBody(_In):
    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class ChatCompletion(_In):
    id: str | None = None
    choices: list[Choice] = []
    usage: Usage | None = None


class ChunkChoice(_In):
    index: int = 0
    delta: ResponseMessage = msgspec.field(default_factory=ResponseMessage)
    finish_reason: str | None = None


class ChatChunk(_In):
    choices: list[ChunkChoice] = []
    usage: Usage | None = None
    error: ErrorBody | str | None = None


class ModelMeta(_In):
    n_ctx: int | None = None  # llama.cpp: the runtime context size


class ModelEntry(_In):
    id: str
    owned_by: str | None = None
    max_model_len: int | None = None  # vLLM and SGLang
    meta: ModelMeta | None = None

    @property
    def context_window(self) -> int | None:
        return self.max_model_len or (self.meta.n_ctx if self.meta else None)


class ModelList(_In):
    data: list[ModelEntry] = []


CHAT_COMPLETION = msgspec.json.Decoder(ChatCompletion)
CHAT_CHUNK = msgspec.json.Decoder(ChatChunk)
MODEL_LIST = msgspec.json.Decoder(ModelList)
ENCODER = msgspec.json.Encoder()
