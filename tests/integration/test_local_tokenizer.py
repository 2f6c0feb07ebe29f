"""count_tokens with the model's own tokenizer.json and chat template, when the
upstream cannot count (here: a generic OpenAI-compatible server)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from dragoman.core.config import ConfigError
from tests.support.servers import GatewayServer, make_config

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    tokenizer.train_from_iterator(["You are brief. What is the weather in Paris today? Sunny and warm."] * 20, trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return tmp_path


def test_count_tokens_uses_the_configured_tokenizer(upstream, tokenizer_dir):
    upstream.models = [{"id": "local-model", "owned_by": "someone"}]  # a server with no tokenize endpoint
    config = make_config(
        upstream.url, models=[{"name": "local-model", "upstream": "default", "tokenizer": str(tokenizer_dir)}]
    )
    gateway = GatewayServer(config).start()
    try:
        body = {
            "model": "local-model",
            "system": "You are brief.",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        }
        response = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body)
    finally:
        gateway.stop()
    assert response.status_code == 200, response.text
    assert response.headers["x-token-count-method"] == "tokenizer"
    prompt = "<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    expected = len(
        Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(prompt, add_special_tokens=False).ids
    )
    assert response.json() == {"input_tokens": expected}


def test_a_missing_tokenizer_fails_at_startup_naming_the_key(upstream, tmp_path):
    config = make_config(
        upstream.url, models=[{"name": "m", "upstream": "default", "tokenizer": str(tmp_path / "nope")}]
    )
    with pytest.raises(ConfigError, match=r"models\.0\.tokenizer: no tokenizer.json"):
        GatewayServer(config)


def _byte_level_tiktoken(path: Path) -> Path:
    """A tiny .tiktoken file: every single byte is a token (rank = byte value)."""
    import base64

    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines.append(f"{base64.b64encode(b'weather').decode()} 256")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_count_tokens_with_a_local_tiktoken_file(upstream, tmp_path):
    upstream.models = [{"id": "gpt-test", "owned_by": "someone"}]
    file = _byte_level_tiktoken(tmp_path / "tiny.tiktoken")
    config = make_config(
        upstream.url,
        models=[
            {"name": "gpt-test", "upstream": "default", "tiktoken_encoding": "cl100k_base", "tiktoken_file": str(file)}
        ],
    )
    gateway = GatewayServer(config).start()
    try:
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "weather?"}]}
        response = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body)
    finally:
        gateway.stop()
    assert response.headers["x-token-count-method"] == "tokenizer"
    # 3 (reply priming) + 3 (message framing) + "user" (4 byte tokens) + "weather" (1 merged token) + "?" (1)
    assert response.json() == {"input_tokens": 3 + 3 + 4 + 1 + 1}


def test_a_missing_tiktoken_file_fails_at_startup_with_advice(upstream, tmp_path):
    config = make_config(
        upstream.url,
        models=[
            {
                "name": "m",
                "upstream": "default",
                "tiktoken_encoding": "o200k_base",
                "tiktoken_file": str(tmp_path / "none"),
            }
        ],
    )
    with pytest.raises(ConfigError, match=r"models\.0\.tiktoken_file: no tiktoken file .*cannot fetch it offline"):
        GatewayServer(config)


def test_count_tokens_asks_vllm_to_render_and_count_the_translated_request(make_gateway, upstream):
    gateway = make_gateway()  # the fake says owned_by "vllm"
    body = {
        "model": "test-model", "system": "Be brief.",
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "weather in Paris please"}],
    }  # fmt: skip
    first = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body)
    second = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body)
    assert first.headers["x-token-count-method"] == "upstream"
    counted = [r for r in upstream.tokenize_requests if r["messages"] != [{"role": "user", "content": "Hello"}]]
    sent = counted[0]  # (discovery's probes of the chat template, with and without a tool, left out)
    assert sent["model"] == "test-model" and sent["add_generation_prompt"] is True
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Paris please"},
    ]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    expected = 2 + 4 + len(json.dumps(sent["tools"]).split()) + 5
    assert first.json() == second.json() == {"input_tokens": expected}
    assert len(counted) == 1  # identical requests are counted once
