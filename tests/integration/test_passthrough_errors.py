"""A passthrough server's error reaches the SDK in Anthropic's envelope: llama-server's
OpenAI-shaped error bodies become it."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from tests.fake_anthropic import FakeAnthropic, NativeReply
from tests.integration.test_passthrough import ASK, _config
from tests.servers import GatewayServer


@pytest.fixture
def passthrough(native: FakeAnthropic) -> Iterator[GatewayServer]:
    server = GatewayServer(_config(native, api_keys=["client-key"])).start()
    yield server
    server.stop()


def sdk(server: GatewayServer, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="client-key", max_retries=retries)


# llama-server's own words for a prompt longer than its context (observed, -c 512).
LLAMA_OVERFLOW = {
    "code": 400, "message": "request (1031 tokens) exceeds the available context size (512 tokens), try increasing it",
    "type": "exceed_context_size_error", "n_prompt_tokens": 1031, "n_ctx": 512,
}  # fmt: skip


LLAMA_NO_VISION = {"code": 500, "message": "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
                   "type": "server_error"}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
@pytest.mark.parametrize(
    ("status", "error", "said"),
    [(400, LLAMA_OVERFLOW, "prompt is too long: 1031 tokens > 512 maximum"), (500, LLAMA_NO_VISION, "the model behind upstream native does not accept images")],
    ids=["overflow", "no-vision"],
)  # fmt: skip
def test_llama_servers_openai_shaped_error_body_is_anthropics_envelope(passthrough, native, stream, status, error, said):
    # What llama-server answers, streamed or not: a JSON error in OpenAI's shape, which was
    # relayed as it was (it has `error.type` and `error.message`, not Anthropic's `"type": "error"`).
    native.replies.append(NativeReply(status=status, body={"error": error}))
    with pytest.raises(anthropic.BadRequestError) as caught:  # neither is retried: a 400
        if stream:
            with sdk(passthrough).messages.stream(**ASK) as s:
                s.get_final_message()
        else:
            sdk(passthrough).messages.create(**ASK)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"].startswith(said)
