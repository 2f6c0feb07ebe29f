"""Claude Code's auto mode, answered by the gateway.

In auto mode Claude Code sends `safeguards: [{"type": "dangerous_tool_use", ...}]` with the
beta `dangerous-tool-use-2026-09-03`, and expects a verdict for every `tool_use` block of
the reply in `safeguard_results`. Open models' servers know neither, so the gateway strips
both before the upstream, judges the reply's tool calls with one call to the configured
classifier model, and adds the verdicts (`service.Safeguards`). Claude Code's own classifier
requests, which it sends when a verdict is missing, are answered by the same model in the
tag format it parses (`monitor`). See docs/claude-code.md#auto-mode.
"""
