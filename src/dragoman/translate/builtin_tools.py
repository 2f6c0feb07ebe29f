"""Input schemas for Anthropic-defined client tools, so an open model can drive them.

Clients declare these tools by a versioned `type` (`bash_20250124`) and no schema:
Claude knows the schema from training. The schemas below follow what Anthropic
documents as each tool's input; the client executes the calls as usual.
"""

from __future__ import annotations

from typing import Any

from dragoman.protocol import anthropic

_BASH = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to run."},
        "restart": {"type": "boolean", "description": "Restart the bash session instead of running a command."},
    },
}


def _editor(commands: list[str], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": commands, "description": description},
            "path": {"type": "string", "description": "Absolute path to the file or directory."},
            "file_text": {"type": "string", "description": "Content of the file to create (create)."},
            "old_str": {"type": "string", "description": "Exact text to replace (str_replace)."},
            "new_str": {"type": "string", "description": "Replacement text (str_replace) or text to insert (insert)."},
            "insert_line": {
                "type": "integer",
                "description": "Line after which to insert; 0 inserts at the top (insert).",
            },
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "1-based [start, end] lines to view; end -1 means to the end of the file (view).",
            },
        },
        "required": ["command", "path"],
    }


_EDITOR_WITH_UNDO = _editor(["view", "create", "str_replace", "insert", "undo_edit"], "The edit to make.")
_EDITOR = _editor(["view", "create", "str_replace", "insert"], "The edit to make.")

_COMPUTER_ACTIONS_2024 = [
    "key", "type", "mouse_move", "left_click", "left_click_drag", "right_click",
    "middle_click", "double_click", "screenshot", "cursor_position",
]  # fmt: skip
_COMPUTER_ACTIONS_2025 = _COMPUTER_ACTIONS_2024 + [
    "triple_click", "left_mouse_down", "left_mouse_up", "scroll", "hold_key", "wait",
]  # fmt: skip


def _computer(actions: list[str], tool: anthropic.Tool) -> dict[str, Any]:
    size = ""
    if tool.display_width_px and tool.display_height_px:
        size = f" The screen is {tool.display_width_px}x{tool.display_height_px} pixels."
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": actions, "description": "The action to perform." + size},
            "coordinate": {"type": "array", "items": {"type": "integer"}, "description": "[x, y] in pixels."},
            "start_coordinate": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "[x, y] where a drag starts.",
            },
            "text": {"type": "string", "description": "Text to type, or the key (combination) to press."},
            "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
            "scroll_amount": {"type": "integer"},
            "duration": {"type": "number", "description": "Seconds to hold a key or to wait."},
            "key": {"type": "string", "description": "Modifier key held during a click or scroll."},
        },
        "required": ["action"],
    }
    if "zoom" in actions:
        schema["properties"]["region"] = {
            "type": "array",
            "items": {"type": "integer"},
            "description": "[x0, y0, x1, y1] to zoom into.",
        }
    return schema


_MEMORY = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
        "path": {"type": "string"},
        "view_range": {"type": "array", "items": {"type": "integer"}},
        "file_text": {"type": "string"},
        "old_str": {"type": "string"},
        "new_str": {"type": "string"},
        "insert_line": {"type": "integer"},
        "insert_text": {"type": "string"},
        "old_path": {"type": "string"},
        "new_path": {"type": "string"},
    },
    "required": ["command"],
}

_DESCRIPTIONS = {
    "bash": "Run commands in a persistent bash shell.",
    "editor": "View, create and edit text files.",
    "computer": "Control the computer's screen, mouse and keyboard.",
    "memory": "Store and retrieve information in a memory directory across conversations.",
}

# type -> (description key, schema builder)
_BUILTIN = {
    "bash_20241022": ("bash", lambda t: _BASH),
    "bash_20250124": ("bash", lambda t: _BASH),
    "text_editor_20241022": ("editor", lambda t: _EDITOR_WITH_UNDO),
    "text_editor_20250124": ("editor", lambda t: _EDITOR_WITH_UNDO),
    "text_editor_20250429": ("editor", lambda t: _EDITOR),
    "text_editor_20250728": ("editor", lambda t: _EDITOR),
    "computer_20241022": ("computer", lambda t: _computer(_COMPUTER_ACTIONS_2024, t)),
    "computer_20250124": ("computer", lambda t: _computer(_COMPUTER_ACTIONS_2025, t)),
    "computer_20251124": ("computer", lambda t: _computer(_COMPUTER_ACTIONS_2025 + ["zoom"], t)),
    "memory_20250818": ("memory", lambda t: _MEMORY),
}

CLIENT_TOOL_FAMILIES = ("bash_", "text_editor_", "computer_", "memory_")
SERVER_TOOL_FAMILIES = (
    "web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_toolset", "advisor_",
)  # fmt: skip


def builtin_schema(tool: anthropic.Tool) -> tuple[str, dict[str, Any]] | None:
    """(description, input schema) for a known Anthropic-defined tool type, else None."""
    entry = _BUILTIN.get(tool.type or "")
    if entry is None:
        return None
    kind, build = entry
    return _DESCRIPTIONS[kind], build(tool)


def known_builtin_types(prefix: str) -> list[str]:
    return sorted(t for t in _BUILTIN if t.startswith(prefix))
