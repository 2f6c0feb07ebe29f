"""The pure parts of the server tools: sealing encrypted_content, matching domains, reading a
page's text, turning result blocks sent back into what the model saw, and which MCP tools a
toolset enables."""

from __future__ import annotations

import msgspec
import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic as a
from dragoman.servertools.history import has_server_blocks, rewritten
from dragoman.servertools.mcp_client import enabled_tools
from dragoman.servertools.sealing import Sealed, Sealer, local_secret
from dragoman.servertools.search import Hit, Query, filtered, matches
from dragoman.servertools.webfetch import context_urls, page_text, urls_in

ITEM = Sealed("https://example.org/a", "A title", "a snippet " * 40, "3 days ago")


def test_sealed_content_opens_with_the_same_secret_only():
    sealed = Sealer(b"shared").seal(ITEM)
    assert "snippet" not in sealed and len(sealed) < len(ITEM.snippet)  # compressed, opaque
    assert Sealer(b"shared").open(sealed, "here") == ITEM
    with pytest.raises(InvalidRequest, match="^here: invalid encrypted_content"):
        Sealer(b"other").open(sealed, "here")


@pytest.mark.parametrize("change", [lambda s: s[:-1], lambda s: s[:10] + ("A" if s[10] != "A" else "B") + s[11:],
                                    lambda s: "", lambda s: "!!not base64!!", lambda s: s + "AAAA"])  # fmt: skip
def test_any_change_to_sealed_content_is_refused(change):
    sealed = Sealer(b"k").seal(ITEM)
    with pytest.raises(InvalidRequest, match="encrypted_content"):
        Sealer(b"k").open(change(sealed), "messages.1.content.0")


def test_domains_match_subdomains_and_path_prefixes_but_not_lookalikes():
    assert matches("https://docs.example.com/x", ("example.com",))
    assert matches("https://example.com/blog/post", ("example.com/blog",))
    assert not matches("https://example.com/shop", ("example.com/blog",))
    assert not matches("https://notexample.com/", ("example.com",))
    assert matches("https://EXAMPLE.com/", ("example.com/*",))


def test_results_are_filtered_by_the_lists_and_cut_to_the_limit():
    hits = [Hit(f"https://{host}/p", host, "") for host in ("a.org", "b.a.org", "c.org", "d.org")] + [
        Hit("javascript:alert(1)", "x", "")
    ]
    assert [h.title for h in filtered(hits, Query("q", allowed=("a.org",)), 5)] == ["a.org", "b.a.org"]
    assert [h.title for h in filtered(hits, Query("q", blocked=("a.org",)), 1)] == ["c.org"]
    assert len(filtered(hits, Query("q"), 10)) == 4  # a result that is no web URL is dropped


def test_a_page_becomes_its_title_and_visible_text():
    title, text = page_text("<html><head><title>T</title><script>x=1</script></head><body><p>One &amp; two</p>"
                            "<style>p{}</style><p>Three</p></body></html>")  # fmt: skip
    assert title == "T"
    assert text == "One & two\n\nThree" or text == "One & two\nThree"


def test_the_urls_a_conversation_holds_are_found_anywhere_in_it():
    messages = [a.MessageParam(role="user", content="see https://example.org/a, and (https://b.org/x)"),
                a.MessageParam(role="user", content=[a.ToolResultBlock(tool_use_id="t", content="at http://c.org/y.")])]  # fmt: skip
    assert context_urls(messages) == {"https://example.org/a", "https://b.org/x", "http://c.org/y"}
    assert urls_in("no url here") == set()


def _decoded(content: list) -> list[a.MessageParam]:
    body = msgspec.json.encode({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": content}]})  # fmt: skip
    return a.MESSAGES_REQUEST.decode(body).messages


def test_result_blocks_sent_back_become_the_calls_and_results_they_were():
    messages = _decoded([
        {"type": "text", "text": "Let me look."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "Nothing found."},
    ])  # fmt: skip
    assert has_server_blocks(messages)
    out = rewritten(messages, lambda block, where: f"shown {where}")
    assert [m.role for m in out] == ["user", "assistant", "user", "assistant"]
    use = out[1].content[1]
    assert isinstance(use, a.ToolUseBlock) and (use.id, use.name, use.input) == (
        "srvtoolu_1",
        "web_search",
        {"query": "q"},
    )
    result = out[2].content[0]
    assert isinstance(result, a.ToolResultBlock) and result.content == "shown messages.1.content.2"
    assert out[3].content[0].text == "Nothing found."


def test_blocks_of_a_tool_not_run_here_are_dropped_in_pairs():
    messages = _decoded([
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "Answer."},
    ])  # fmt: skip
    out = rewritten(messages, lambda block, where: None)
    assert [m.role for m in out] == ["user", "assistant"] and [type(b) for b in out[1].content] == [a.TextBlock]


def test_a_toolsets_configs_win_over_its_default_and_the_older_shape_lists_allowed_tools():
    server = a.McpServer(type="url", url="https://x", name="s")
    toolset = a.Tool(type="mcp_toolset", mcp_server_name="s", default_config={"enabled": False},
                     configs={"b": {"enabled": True}})  # fmt: skip
    assert enabled_tools(server, toolset, ["a", "b", "c"]) == ["b"]
    assert enabled_tools(server, a.Tool(type="mcp_toolset", mcp_server_name="s"), ["a", "b"]) == ["a", "b"]
    old = msgspec.structs.replace(server, tool_configuration={"allowed_tools": ["c"]})
    assert enabled_tools(old, None, ["a", "c"]) == ["c"]
    assert enabled_tools(msgspec.structs.replace(server, tool_configuration={"enabled": False}), None, ["a"]) == []


def test_without_a_configured_secret_every_process_of_the_machine_shares_one(tmp_path, monkeypatch):
    """Workers and restarts read one secret kept in the data directory, made once, not readable by others."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    item = Sealed(url="https://example.com/a", title="A", snippet="about a")
    sealed = Sealer.shared(None).seal(item)
    assert Sealer.shared(None).open(sealed, "x") == item  # another process, or after a restart
    kept = tmp_path / "dragoman" / "secrets" / "web_search"
    assert len(kept.read_bytes()) == 32 and kept.stat().st_mode & 0o077 == 0
    assert [p.name for p in kept.parent.iterdir()] == ["web_search"]  # no temporary file left behind


def test_a_secret_that_cannot_be_kept_is_the_process_own(tmp_path):
    unwritable = tmp_path / "file"
    unwritable.write_text("")  # a file where the directory would go
    first, second = local_secret(unwritable / "secrets"), local_secret(unwritable / "secrets")
    assert len(first) == 32 and first != second
