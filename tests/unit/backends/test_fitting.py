"""max_tokens fitted to the model's output cap and context window (backends.fitting)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgspec
import pytest

from dragoman.backends.openai.fitting import fitted_body
from dragoman.calls.types import Route
from dragoman.core.capabilities import ModelCaps
from dragoman.protocol import openai

WINDOW = 1000
PROMPT = [
    openai.UserMessage(content="word " * WINDOW)
]  # more bytes than the window: the prompt is counted, as `count` says


@pytest.mark.parametrize(
    ("asked", "cap", "window", "prompt", "method", "sent", "window_bound"),
    [
        (50, None, None, 0, "upstream", 50, False),
        (50, None, WINDOW, 950, "upstream", 50, False),  # exactly fits
        (50, None, WINDOW, 997, "upstream", 3, True),  # the window leaves room for 3
        (50, None, WINDOW, 997, "tokenizer", 3, True),
        (50, None, WINDOW, 997, "estimate", 50, False),  # an estimate lowers nothing
        (50, 20, None, 0, "upstream", 20, False),  # the model's output cap only
        (50, 20, WINDOW, 975, "upstream", 20, False),  # the cap binds before the window does
        (50, 20, WINDOW, 990, "upstream", 10, True),  # the window binds below the cap
        (3, None, WINDOW, 997, "upstream", 3, False),  # asked exactly the room left
    ],
)
def test_fitted_max_tokens_and_whether_the_window_bound_it(
    asked: int, cap: int | None, window: int | None, prompt: int, method: str, sent: int, window_bound: bool
) -> None:
    chat = openai.ChatRequest(model="m", messages=list(PROMPT), max_tokens=asked)
    route = Route(cast(Any, None), "default", "m", ModelCaps(max_output_tokens=cap), context_window=window)

    async def count(_: openai.ChatRequest) -> tuple[int, str]:
        return prompt, method

    fitted = asyncio.run(fitted_body(chat, route, asked, count))
    assert msgspec.json.decode(fitted.body)["max_tokens"] == sent
    assert fitted.window_bound is window_bound
