"""A translated stream's first and last events written from templates (`sse.message_start`,
`backends.openai.frames.text_end`) are byte for byte the events' own encoding, whatever the
model, id, block index, stop reason and counts."""

from __future__ import annotations

import msgspec
import pytest

from dragoman.backends.openai.frames import text_end
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.protocol.sse import encode, encode_all, message_start
from dragoman.translate.stream import StreamTranslator


@pytest.mark.parametrize("model", ["m", "bench-model", 'qu"ote\\d/ünï', "\x00id"])
@pytest.mark.parametrize("message_id", ["msg_1", "msg_01XyZ", 'a"b\\c', ""])
def test_a_message_start_is_its_encoding(model: str, message_id: str) -> None:
    start = StreamTranslator(model=model, message_id=message_id, new_tool_id=str).start()[0]
    assert isinstance(start, a.MessageStart)
    assert message_start(start) == encode(start)
    assert message_start(start) == encode(start)  # from the template made by the first


def chunk(**fields: object) -> openai.ChatChunk:
    choice = {"index": 0, "delta": fields.get("delta", {}), "finish_reason": fields.get("finish_reason")}
    body = {"id": "c", "model": "m", "choices": [choice] if fields.get("choices", True) else []}
    if "usage" in fields:
        body["usage"] = fields["usage"]
    return openai.CHAT_CHUNK.decode(msgspec.json.encode(body))


def translator_with_text(finish: str | None, usage: dict[str, object] | None, blocks: int) -> StreamTranslator:
    translator = StreamTranslator(model="m", message_id="msg", new_tool_id=lambda: "toolu_1")
    for block in range(blocks - 1):  # tool calls before the text: its index is theirs after
        call = {"index": block, "id": f"c{block}", "function": {"name": "f", "arguments": "{}"}}
        translator.feed(chunk(delta={"tool_calls": [call]}))
    translator.feed(chunk(delta={"content": "Hello"}))
    translator.feed(chunk(finish_reason=finish))
    if usage is not None:
        translator.feed(chunk(choices=False, usage=usage))
    return translator


USAGES: list[dict[str, object] | None] = [
    None,
    {"prompt_tokens": 40, "completion_tokens": 500},
    {"prompt_tokens": 1_000_000_001, "completion_tokens": 1_000_000_002},
    {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
    {"prompt_tokens": 9, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2}},
]


@pytest.mark.parametrize("finish", [None, "stop", "length", "tool_calls", "content_filter"])
@pytest.mark.parametrize("usage", range(len(USAGES)))
@pytest.mark.parametrize("blocks", [1, 3])
def test_a_text_replys_end_is_its_events_encoding(finish: str | None, usage: int, blocks: int) -> None:
    expected = encode_all(translator_with_text(finish, USAGES[usage], blocks).finish())
    translator = translator_with_text(finish, USAGES[usage], blocks)
    end = translator.text_end()
    assert end is not None
    assert text_end(*end) == expected
    assert translator.text_end() is None  # the block is closed


@pytest.mark.parametrize(
    "options", [{"stop_sequences": ["zz"]}, {"prefill": "Hello there"}, {}], ids=["stops", "prefill", "no-text"]
)
def test_a_reply_with_something_held_back_has_no_text_end(options: dict[str, object]) -> None:
    translator = StreamTranslator(model="m", message_id="msg", new_tool_id=str, **options)  # type: ignore[arg-type]
    if options:
        translator.feed(chunk(delta={"content": "Hel"}))
    assert translator.text_end() is None
    assert translator.finish()[-1] == a.MessageStop()  # finish still ends it
