"""Web fetch run by the gateway through its URL fetcher, with the official SDK: a page on a
loopback socket (private addresses allowed in these configs), refused for a URL the
conversation never named, for a private address without fetch_allow_private, for a blocked
domain; max_content_tokens and the usage count honoured."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types import ServerToolUseBlock

from dragoman.core.config_load import from_dict
from tests.support.fakes import FakeUpstream, Reply, text_stream, tool_call_stream
from tests.support.search_fakes import FakePages
from tests.support.servers import GatewayServer

FETCH_TOOL = {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 3}


@pytest.fixture
def pages() -> Iterator[FakePages]:
    fake = FakePages().start()
    yield fake
    fake.stop()


@pytest.fixture
def client(upstream: FakeUpstream) -> Iterator[Callable[..., anthropic.Anthropic]]:
    started: list[GatewayServer] = []

    def start(allow_private: bool = True) -> anthropic.Anthropic:
        data: dict[str, Any] = {"server": {"fetch_allow_private": allow_private},
                                "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}, "web_fetch": {}}  # fmt: skip
        server = GatewayServer(from_dict(data)).start()
        started.append(server)
        return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)

    yield start
    for server in started:
        server.stop()


def _fetching(upstream: FakeUpstream, url: str, answer: str = "Read it.") -> None:
    upstream.queue(Reply(chunks=tool_call_stream("web_fetch", {"url": url})), Reply(chunks=text_stream(answer)))


def _ask(client: anthropic.Anthropic, text: str, tool: dict | None = None, stream: bool = False) -> Any:
    kw: dict[str, Any] = {"model": "test-model", "max_tokens": 99, "tools": [tool or FETCH_TOOL],
                          "messages": [{"role": "user", "content": text}]}  # fmt: skip
    if stream:
        with client.messages.stream(**kw) as events:
            return events.get_final_message()
    return client.messages.create(**kw)


@pytest.mark.parametrize("stream", [False, True])
def test_a_page_the_user_named_is_fetched_as_a_document(client, upstream, pages, stream):
    _fetching(upstream, pages.url())
    message = _ask(client(), f"Summarise {pages.url()} please", stream=stream)
    use, result, text = message.content
    assert isinstance(use, ServerToolUseBlock) and use.name == "web_fetch" and use.input == {"url": pages.url()}
    assert result.type == "web_fetch_tool_result" and result.tool_use_id == use.id
    fetched = result.content
    assert fetched.type == "web_fetch_result" and fetched.url == pages.url() and fetched.retrieved_at
    assert fetched.content.type == "document" and fetched.content.title == "Dragoman handbook"
    assert fetched.content.source.type == "text" and fetched.content.source.media_type == "text/plain"
    assert "Dragoman runs web search & web fetch for open models." in fetched.content.source.data
    assert "not page text" not in fetched.content.source.data and "color:red" not in fetched.content.source.data
    assert text.text == "Read it."
    assert message.usage.server_tool_use.web_fetch_requests == 1
    assert message.usage.server_tool_use.web_search_requests == 0
    handed = [m["content"] for m in upstream.requests[1]["messages"] if m["role"] == "tool"]
    assert "It is configured in TOML." in handed[0]


def test_a_url_the_conversation_never_named_is_not_fetched(client, upstream, pages):
    _fetching(upstream, pages.url())
    message = _ask(client(), "Fetch whatever you like")
    assert message.content[1].content.type == "web_fetch_tool_result_error"
    assert message.content[1].content.error_code == "url_not_in_prior_context"
    assert pages.requests == [] and message.usage.server_tool_use.web_fetch_requests == 0


def test_a_private_address_is_refused_unless_the_gateway_allows_it(client, upstream, pages):
    _fetching(upstream, pages.url())
    message = _ask(client(allow_private=False), f"Read {pages.url()}")
    assert message.content[1].content.error_code == "url_not_allowed"
    assert pages.requests == []


def test_blocked_domains_and_content_types_are_refused_in_band(client, upstream, pages):
    gateway = client()
    _fetching(upstream, pages.url())
    blocked = _ask(gateway, f"Read {pages.url()}", {**FETCH_TOOL, "blocked_domains": ["127.0.0.1"]})
    assert blocked.content[1].content.error_code == "url_not_allowed"
    _fetching(upstream, pages.url("image.png"))
    image = _ask(gateway, f"Read {pages.url('image.png')}")
    assert image.content[1].content.error_code == "unsupported_content_type"


def test_max_content_tokens_cuts_the_page(client, upstream, pages):
    _fetching(upstream, pages.url("notes.txt"))
    message = _ask(client(), f"Read {pages.url('notes.txt')}", {**FETCH_TOOL, "max_content_tokens": 10})
    assert message.content[1].content.content.source.data == ("plain notes " * 50)[:40]


def test_a_fetched_page_sent_back_is_shown_to_the_model_again(client, upstream, pages):
    gateway = client()
    _fetching(upstream, pages.url())
    first = _ask(gateway, f"Read {pages.url()}")
    upstream.queue(Reply(chunks=text_stream("Still here.")))
    history = [{"role": "user", "content": f"Read {pages.url()}"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": "And again?"}]  # fmt: skip
    again = gateway.messages.create(model="test-model", max_tokens=99, messages=history, tools=[FETCH_TOOL])
    assert again.content[0].text == "Still here."
    tool_messages = [m["content"] for m in upstream.requests[-1]["messages"] if m["role"] == "tool"]
    assert "It is configured in TOML." in tool_messages[0]
