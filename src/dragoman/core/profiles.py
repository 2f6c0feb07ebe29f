"""What differs between OpenAI-compatible servers, as data.

A profile is picked by the upstream's `flavor` (configured, or recognised from the
`owned_by` field of its `/models` list) and consulted by the translator; no code
branches on a server's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from dragoman.core.config import OpenAIUpstream

TokenCounter = Literal["vllm", "llamacpp"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    # How a trailing assistant turn (a prefill) is continued: vLLM and SGLang need
    # explicit flags; llama.cpp and Ollama continue a final assistant message natively.
    prefill: Literal["continue_final_message", "native"] = "native"
    # Sampling fields the server rejects rather than ignores.
    accepts_top_k: bool = True
    accepts_user: bool = False
    # JSON Schema keys the server's tool-schema validator rejects.
    strip_schema_keys: tuple[str, ...] = ()
    # The assistant-message field the server reads prior reasoning from.
    reasoning_field: Literal["reasoning", "reasoning_content"] = "reasoning_content"
    # OpenAI's reasoning models take max_completion_tokens and reject max_tokens.
    reasoning_max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # How the server counts a chat request's prompt tokens without running the model.
    token_counter: TokenCounter | None = None
    # Read every reply as a stream: llama.cpp notices a closed connection reliably
    # only while streaming, so a client that leaves would otherwise keep it busy.
    stream_upstream: bool = False
    # Where a model's context window is read when /models does not say.
    context_probe: Literal["ollama_show"] | None = None


PROFILES: dict[str, Profile] = {
    "vllm": Profile("vllm", prefill="continue_final_message", reasoning_field="reasoning", token_counter="vllm"),
    "sglang": Profile("sglang", prefill="continue_final_message"),
    "llamacpp": Profile("llamacpp", token_counter="llamacpp", stream_upstream=True),
    "ollama": Profile("ollama", reasoning_field="reasoning", context_probe="ollama_show"),
    "openai": Profile(
        "openai", accepts_top_k=False, accepts_user=True, reasoning_max_tokens_field="max_completion_tokens"
    ),
    "generic": Profile("generic", accepts_top_k=True),
}

# `owned_by` values in GET /models that identify a server.
OWNED_BY = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "library": "ollama",
    "openai": "openai",
    "system": "openai",
}


def profile_for(upstream: OpenAIUpstream, owned_by: str | None = None) -> Profile:
    flavor: str = upstream.flavor
    if flavor == "auto":
        flavor = OWNED_BY.get(owned_by or "", "generic")
    profile = PROFILES[flavor]
    if upstream.strip_schema_keys is not None:
        profile = replace(profile, strip_schema_keys=tuple(upstream.strip_schema_keys))
    return profile
