"""Counting prompt tokens with the model's own tokenizer, when the upstream cannot.

A model's `tokenizer` setting names a `tokenizer.json` (or the directory holding
it, as a Hugging Face model repository lays it out); its chat template comes from
the `chat_template` setting, else `chat_template.jinja` or `tokenizer_config.json`
beside it. The translated request is rendered through that template, as the
backend would render it, and tokenized with the `tokenizers` library. Nothing is
downloaded: the files must be on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from dragoman.protocol import openai


class TokenizerError(Exception):
    """A configured tokenizer that cannot be loaded (named in the message)."""


def _find(path: Path, template: str | None) -> tuple[Path, str | None, dict[str, Any]]:
    directory = path if path.is_dir() else path.parent
    tokenizer_file = path / "tokenizer.json" if path.is_dir() else path
    if not tokenizer_file.is_file():
        raise TokenizerError(f"no tokenizer.json at {tokenizer_file}")
    config: dict[str, Any] = {}
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except ValueError as error:
            raise TokenizerError(f"{config_file}: not valid JSON: {error}") from None
    if template is not None:
        source: str | None = Path(template).expanduser().read_text()
    elif (directory / "chat_template.jinja").is_file():
        source = (directory / "chat_template.jinja").read_text()
    else:
        raw = config.get("chat_template")
        source = raw if isinstance(raw, str) else None
    return tokenizer_file, source, config


def _special(config: dict[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class LocalCounter:
    def __init__(self, path: str, chat_template: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(
                "counting with a local tokenizer needs the `tokenizers` package (pip install 'dragoman[tokenizer]')"
            ) from None
        tokenizer_file, source, config = _find(Path(path).expanduser(), chat_template)
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # the library raises its own exception type
            raise TokenizerError(f"{tokenizer_file}: cannot load: {error}") from None
        self._template = None
        if source is not None:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                raise TokenizerError(
                    "rendering a chat template needs the `jinja2` package (pip install 'dragoman[tokenizer]')"
                ) from None

            def raise_exception(message: str) -> None:
                raise TokenizerError(f"the chat template refused the request: {message}")

            environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            environment.globals["raise_exception"] = raise_exception
            self._template = environment.from_string(source)
        self._bos = _special(config, "bos_token")
        self._eos = _special(config, "eos_token")

    def render(self, chat: openai.ChatRequest) -> str:
        messages = msgspec.to_builtins(chat.messages)
        if self._template is None:  # no template: the texts alone, a close lower bound
            return "\n".join(str(m.get("content") or "") for m in messages)
        tools = msgspec.json.decode(msgspec.json.encode(chat.tools)) if chat.tools else None  # schemas may be raw JSON
        return self._template.render(
            messages=messages, tools=tools, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
        )

    def count(self, chat: openai.ChatRequest) -> int:
        return len(self._tokenizer.encode(self.render(chat), add_special_tokens=False).ids)


class TiktokenCounter:
    """OpenAI models' token counts from a local tiktoken encoding file.

    tiktoken fetches its encodings on first use, which an offline machine cannot;
    here the `.tiktoken` file is named in the configuration (for example
    `o200k_base.tiktoken`, downloaded once elsewhere), and the named encoding
    gives the split pattern and special tokens. Messages are counted as OpenAI
    documents for chat models: the text of each plus a few tokens of framing.
    """

    PER_MESSAGE = 3  # <|start|>{role}\n ... <|end|>
    REPLY_PRIMING = 3  # <|start|>assistant<|message|>

    def __init__(self, encoding: str, path: str) -> None:
        try:
            import tiktoken
            import tiktoken_ext.openai_public as public
            from tiktoken.load import load_tiktoken_bpe
        except ImportError:
            raise TokenizerError(
                "counting with tiktoken needs the `tiktoken` package (pip install 'dragoman[tokenizer]')"
            ) from None
        constructor = public.ENCODING_CONSTRUCTORS.get(encoding)
        if constructor is None:
            raise TokenizerError(
                f"unknown tiktoken encoding {encoding!r}; known: {', '.join(sorted(public.ENCODING_CONSTRUCTORS))}"
            )
        file = Path(path).expanduser()
        if not file.is_file():
            raise TokenizerError(
                f"no tiktoken file at {file} (tiktoken cannot fetch it offline: copy {encoding}.tiktoken there)"
            )
        fetch = public.load_tiktoken_bpe
        # The constructor names a URL to fetch; it reads the configured file instead.
        public.load_tiktoken_bpe = lambda url, expected_hash=None: load_tiktoken_bpe(str(file), None)  # type: ignore[assignment]
        try:
            spec = constructor()
        except Exception as error:  # a corrupt file surfaces as the library's own errors
            raise TokenizerError(f"{file}: cannot load: {error}") from None
        finally:
            public.load_tiktoken_bpe = fetch
        self._encoding = tiktoken.Encoding(**spec)

    def _tokens(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def count(self, chat: openai.ChatRequest) -> int:
        total = self.REPLY_PRIMING
        for message in msgspec.to_builtins(chat.messages):
            total += self.PER_MESSAGE + self._tokens(message.get("role", ""))
            content = message.get("content")
            if isinstance(content, list):
                content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
            total += self._tokens(content or "")
            for call in message.get("tool_calls") or ():
                total += self._tokens(call["function"]["name"]) + self._tokens(call["function"]["arguments"])
        if chat.tools:
            total += self._tokens(openai.ENCODER.encode(chat.tools).decode())
        return total
