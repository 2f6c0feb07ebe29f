"""Fitting a request's max_tokens to what the model can produce."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dragoman.errors import context_limit, context_overflow
from dragoman.protocol import openai

if TYPE_CHECKING:  # routing imports the backends
    from dragoman.routing import Route

log = logging.getLogger("dragoman.upstream")


async def fitted_body(chat: openai.ChatRequest, route: Route, asked: int,
                      count: Callable[[openai.ChatRequest], Awaitable[tuple[int, str]]]) -> bytes:  # fmt: skip
    """The upstream body, with max_tokens lowered to what the model can produce
    (visibly), or fail in Anthropic's words. `count` gives (prompt tokens, method)."""
    body = openai.ENCODER.encode(chat)
    limit = asked
    if route.caps.max_output_tokens is not None and limit > route.caps.max_output_tokens:
        limit = route.caps.max_output_tokens
    window = route.context_window
    if window is not None and limit + len(body) > window:
        # Only a prompt that might not leave room is counted (a token is at least a byte).
        prompt, method = await count(chat)
        if method != "estimate":
            if prompt > window:
                raise context_overflow(prompt, window)
            if prompt == window:
                raise context_limit(prompt, asked, window)
            if prompt + limit > window:
                limit = window - prompt
    if limit == asked:
        return body
    log.info("max_tokens lowered from %d to %d to fit model %s (context %s)", asked, limit, route.upstream_model, window)
    if chat.max_completion_tokens is not None:
        chat.max_completion_tokens = limit
    else:
        chat.max_tokens = limit
    return openai.ENCODER.encode(chat)
