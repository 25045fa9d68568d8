"""Anthropic `tools` and `tool_choice` → canonical `FunctionTool`s and `ToolChoice`.

    "tools": [{"name": "Bash", "description": "…", "input_schema": {"type": "object", …},
               "cache_control": {"type": "ephemeral"}},
              {"name": "DeferredToolPlaceholder", "description": "…", "input_schema": {}, "defer_loading": true}]
    "tool_choice": {"type": "auto" | "any" | "none"} | {"type": "tool", "name": "Bash"},
                   optionally with "disable_parallel_tool_use": true (accepted; zllm does not enforce it)

`defer_loading` keeps Anthropic's meaning: the tool is not shown to the model until the conversation loads
it, i.e. until a `tool_reference` block in a tool result names it (Claude Code's ToolSearch answers with
those) or `tool_choice` forces it. Anthropic-defined tools (a `type` such as "bash_20250124" or
"web_search_20250305", no `input_schema`) are rejected with a 400: zllm runs no server tools and cannot
describe those to a local model.
"""

from __future__ import annotations

from zllm.api.anthropic_messages import wire
from zllm.api.fields import check_type, optional, required
from zllm.api.tool_fields import function_tool, tool_choice_mode
from zllm.canonical import FunctionTool, ToolChoice
from zllm.errors import InvalidRequest


def decode_tool_choice(raw: object, *, has_tools: bool) -> ToolChoice:
    if raw is None:
        return ToolChoice()
    choice = check_type(raw, "object", "tool_choice")
    kind = required(choice, "type", "string", "tool_choice.type")
    mode = wire.TOOL_CHOICE_MODES.get(kind)
    if mode is None:
        raise InvalidRequest(f"`tool_choice.type` must be auto, any, tool or none; got {kind!r}",
                             param="tool_choice.type")
    optional(choice, "disable_parallel_tool_use", "boolean", "tool_choice.disable_parallel_tool_use")
    if mode == "tool":
        return ToolChoice(mode="tool", name=required(choice, "name", "string", "tool_choice.name"))
    return tool_choice_mode(mode, has_tools=has_tools, shown=kind)


def forced_tool_name(raw: object) -> str | None:
    """The tool `tool_choice` forces, if any (a deferred tool it names must be shown to the model)."""
    if isinstance(raw, dict) and raw.get("type") == "tool" and isinstance(raw.get("name"), str):
        return raw["name"]
    return None


def decode_tools(raw: object, *, loaded: set[str]) -> tuple[FunctionTool, ...]:
    """The tools the model sees: every tool except deferred ones not in `loaded`."""
    if raw is None:
        return ()
    items = check_type(raw, "array", "tools")
    tools = []
    for i, item in enumerate(items):
        param = f"tools[{i}]"
        item = check_type(item, "object", param)
        tool = _decode_tool(item, param)
        if not optional(item, "defer_loading", "boolean", f"{param}.defer_loading") or tool.name in loaded:
            tools.append(tool)
    return tuple(tools)


def _decode_tool(item: dict, param: str) -> FunctionTool:
    kind = optional(item, "type", "string", f"{param}.type")
    if kind is not None and kind != wire.CUSTOM_TOOL:
        raise InvalidRequest(
            f"tool type {kind!r} is an Anthropic-defined tool; zllm serves only custom tools "
            "(`name`, `description`, `input_schema`)", param=f"{param}.type")
    return function_tool(item, param, schema_key="input_schema")
