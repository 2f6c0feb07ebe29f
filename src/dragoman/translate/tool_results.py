"""A user turn's tool results as Chat tool messages.

Tool messages hold text only: the images a result returns (a document's included) travel
in a user message after them, each labelled with its tool call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dragoman.protocol import anthropic, openai
from dragoman.translate import content
from dragoman.translate.tool_ids import upstream_tool_id

IMAGE_OMITTED = "[Image omitted: this model does not accept images]"


def tool_result_messages(
    blocks: list[Any], where: str, vision: bool | None, clock: Callable[[], float]
) -> tuple[list[openai.ChatMessage], list[openai.Part]]:
    """Tool messages for a user turn's tool results, plus the images they held. A model
    without vision is told an image was left out, rather than refused the turn: the tool
    chose to return it, not the client."""
    messages: list[openai.ChatMessage] = []
    images: list[openai.Part] = []
    for index, block in enumerate(blocks):
        if not isinstance(block, anthropic.ToolResultBlock):
            continue
        here = f"{where}.{index}.content"
        texts: list[str] = []
        if isinstance(block.content, str):
            texts.append(block.content)
        elif block.content:
            for inner_index, inner in enumerate(block.content):
                if isinstance(inner, anthropic.ToolReferenceBlock):
                    texts.append(f"Tool {inner.tool_name} is now available.")
                    continue
                if isinstance(inner, anthropic.ImageBlock):
                    if vision is False:  # not checked either: the model will not see it
                        texts.append(IMAGE_OMITTED)
                        continue
                    parts: list[openai.Part] = [content.image_part(inner, f"{here}.{inner_index}")]
                else:
                    parts = content.user_parts([inner], here, vision=None, clock=clock, first_index=inner_index)
                for part in parts:
                    if isinstance(part, openai.TextPart):
                        texts.append(part.text)
                    elif vision is False:
                        texts.append(IMAGE_OMITTED)
                    else:
                        if not images:
                            images.append(openai.TextPart(text="Images returned by the tools above:"))
                        images.append(openai.TextPart(text=f"[image from tool result {block.tool_use_id}]"))
                        images.append(part)
        text = "\n".join(texts)
        if block.is_error:
            text = f"[tool error] {text}" if text else "[tool error]"
        messages.append(openai.ToolMessage(tool_call_id=upstream_tool_id(block.tool_use_id), content=text))
    return messages, images
