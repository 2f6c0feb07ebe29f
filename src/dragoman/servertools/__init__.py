"""Anthropic's server tools run by the gateway on the translating path: web search (against a
search service the operator runs), web fetch (through `backends.fetch`) and MCP servers (as an
MCP client). The model is offered each as an ordinary function; when it calls one, the gateway
runs it, hands the result back and asks again, and the client gets Anthropic's own blocks
(`server_tool_use` + `web_search_tool_result`, ...). See docs/server-tools.md.
"""
