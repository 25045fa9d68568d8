"""Responses tools → canonical function tools, and the map back from canonical tool calls to wire items.

    {"type": "function", "name": "exec_command", "strict": false, "parameters": {…}}
        → FunctionTool("exec_command", parameters={…})
    {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn_agent", …}]}
        → FunctionTool("multi_agent_v1.spawn_agent", …)     calls come back as
          {"type": "function_call", "name": "spawn_agent", "namespace": "multi_agent_v1", …}
    {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: …"}}
        → FunctionTool("apply_patch", parameters={"type": "object", "properties": {"input": {"type": "string"}}, …})
          calls come back as {"type": "custom_tool_call", "name": "apply_patch", "input": "<the string>"}
    {"type": "web_search" | "tool_search" | "image_generation" | "local_shell" | …}   → skipped, logged

A custom tool's grammar travels as `FunctionTool.grammar` (the fence enforces it where the dialect writes the
input as raw text); `ToolSet.custom_formats` keeps the wire format for encoding calls back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from zllm.api.fields import check_type, optional, required
from zllm.api.openai_responses import wire
from zllm.api.tool_fields import function_tool, openai_choice_mode, tool_name
from zllm.canonical import FunctionTool, ToolChoice, ToolGrammar

log = logging.getLogger("zllm.api")

CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {wire.CUSTOM_INPUT: {"type": "string", "description": "The tool input, as free-form text."}},
    "required": [wire.CUSTOM_INPUT],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class WireTool:
    """How a canonical tool appears on the wire."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class CustomFormat:
    """A custom tool's input format: `grammar` (`syntax` lark or regex, with its `definition`) or `text`."""

    kind: str
    syntax: str | None = None
    definition: str | None = None


@dataclass(frozen=True)
class ToolSet:
    tools: tuple[FunctionTool, ...] = ()
    wire: dict[str, WireTool] = field(default_factory=dict)  # canonical name → wire identity
    custom_formats: dict[str, CustomFormat] = field(default_factory=dict)

    def wire_tool(self, canonical_name: str) -> WireTool:
        """The wire identity of a tool the model called; a name we never declared is passed on as a function."""
        return self.wire.get(canonical_name) or WireTool("function", canonical_name)


def qualified_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{wire.NAMESPACE_SEPARATOR}{name}" if namespace else name


def custom_arguments(text: str) -> str:
    """The canonical arguments of a custom tool call with input `text` (one fixed serialization, so an
    echoed call renders exactly as the stored one)."""
    return json.dumps({wire.CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The freeform input inside canonical custom-call arguments; the raw text if the model wrote no JSON."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(wire.CUSTOM_INPUT), str):
        return value[wire.CUSTOM_INPUT]
    return arguments


def decode_tools(declared: Iterable[tuple[object, str]]) -> ToolSet:
    """`declared`: (tool JSON, its param path) pairs, in order. A later tool with the same name replaces the
    earlier one (a conversation may declare a tool again)."""
    tools: dict[str, FunctionTool] = {}
    wire_tools: dict[str, WireTool] = {}
    formats: dict[str, CustomFormat] = {}
    for raw, param in declared:
        for tool, wire_tool, custom_format in _decode_tool(raw, param):
            tools[tool.name] = tool
            wire_tools[tool.name] = wire_tool
            if custom_format is not None:
                formats[tool.name] = custom_format
    return ToolSet(tuple(tools.values()), wire_tools, formats)


_Decoded = tuple[FunctionTool, WireTool, CustomFormat | None]


def _decode_tool(raw: object, param: str, namespace: str | None = None) -> list[_Decoded]:
    item = check_type(raw, "object", param)
    kind = required(item, "type", "string", f"{param}.type")
    if kind == wire.FUNCTION_TOOL:
        return [_function_tool(item, param, namespace)]
    if kind == wire.CUSTOM_TOOL:
        return [_custom_tool(item, param, namespace)]
    if kind == wire.NAMESPACE_TOOL and namespace is None:
        return _namespace_tools(item, param)
    # hosted tools come with every Codex request: a debug line; an unknown type is worth noticing
    level, what = (logging.DEBUG, "a hosted tool") if kind in wire.HOSTED_TOOLS else (logging.INFO, "a tool type")
    log.log(level, "%s: skipping %s (%r): zllm serves function, namespace and custom tools", param, what, kind)
    return []


def _function_tool(item: dict, param: str, namespace: str | None) -> _Decoded:
    tool = function_tool(item, param)
    return (replace(tool, name=qualified_name(tool.name, namespace)), WireTool("function", tool.name, namespace),
            None)


def _custom_tool(item: dict, param: str, namespace: str | None) -> _Decoded:
    name = tool_name(item, param)
    description = optional(item, "description", "string", f"{param}.description") or ""
    raw_format = optional(item, "format", "object", f"{param}.format") or {"type": "text"}
    custom_format = CustomFormat(
        kind=optional(raw_format, "type", "string", f"{param}.format.type") or "text",
        syntax=optional(raw_format, "syntax", "string", f"{param}.format.syntax"),
        definition=optional(raw_format, "definition", "string", f"{param}.format.definition"),
    )
    grammar = None
    if custom_format.kind == "grammar" and custom_format.syntax in ("lark", "regex") and custom_format.definition:
        grammar = ToolGrammar(custom_format.syntax, custom_format.definition)  # the fence enforces it
    tool = FunctionTool(qualified_name(name, namespace), description, CUSTOM_PARAMETERS, grammar=grammar)
    return tool, WireTool("custom", name, namespace), custom_format


def _namespace_tools(item: dict, param: str) -> list[_Decoded]:
    namespace = tool_name(item, param)
    nested = required(item, "tools", "array", f"{param}.tools")
    return [decoded for j, tool in enumerate(nested)
            for decoded in _decode_tool(tool, f"{param}.tools[{j}]", namespace)]


def decode_tool_choice(raw: object, tools: ToolSet) -> ToolChoice:
    if raw is None:
        return ToolChoice()
    if isinstance(raw, str):
        return openai_choice_mode(raw, has_tools=bool(tools.tools), or_else="a tool")
    choice = check_type(raw, "object", "tool_choice")
    kind = required(choice, "type", "string", "tool_choice.type")
    if kind in (wire.FUNCTION_TOOL, wire.CUSTOM_TOOL):
        name = required(choice, "name", "string", "tool_choice.name")
        namespace = optional(choice, "namespace", "string", "tool_choice.namespace")
        return ToolChoice(mode="tool", name=qualified_name(name, namespace))
    if kind == "allowed_tools":
        mode = optional(choice, "mode", "string", "tool_choice.mode") or "auto"
        log.info("tool_choice allowed_tools: the subset is not enforced, only its mode %r", mode)
        return decode_tool_choice(mode, tools)
    log.info("tool_choice %r names a tool zllm does not serve; using auto", kind)
    return ToolChoice()
