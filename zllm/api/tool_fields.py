"""Tool declarations, tool calls and `tool_choice` as every API decodes them, so a tool reads the same (and its
errors read alike) whichever API declared it.

    function_tool(holder, param)                  {"name": …, "description": …, "parameters": {…}}
                                                  (Anthropic's schema key is `input_schema`)
    openai_function_tool(item, param)             {"type": "function", "function": {…}}   (Chat, Ollama)
    openai_tool_call(call, param, position)       {"id": …, "function": {"name": …, "arguments": "…" | {…}}}
    tool_choice_mode("required", has_tools=…)     none / auto / required, the canonical modes
"""

from __future__ import annotations

import json

from zllm.api.fields import check_type, json_type_name, optional, required
from zllm.canonical import FunctionTool, ToolCall, ToolChoice
from zllm.errors import InvalidRequest

FUNCTION = "function"
OPENAI_CHOICE_MODES = ("none", "auto", "required")


def tool_name(holder: dict, param: str) -> str:
    """The holder's `name`: required, and not empty (a nameless tool cannot be called)."""
    name = required(holder, "name", "string", f"{param}.name")
    if not name:
        raise InvalidRequest("tool names must not be empty", param=f"{param}.name")
    return name


def function_tool(holder: dict, param: str, *, schema_key: str = "parameters") -> FunctionTool:
    """The tool `holder` declares by `name`, `description` and its arguments' schema (absent: any object)."""
    name = tool_name(holder, param)
    description = optional(holder, "description", "string", f"{param}.description") or ""
    schema = optional(holder, schema_key, "object", f"{param}.{schema_key}")
    if schema is None:
        return FunctionTool(name=name, description=description)
    return FunctionTool(name=name, description=description, parameters=schema)


def openai_function_tool(item: object, param: str, *, type_required: bool = True) -> FunctionTool:
    """`{"type": "function", "function": {…}}` (Ollama's clients may leave `type` out)."""
    item = check_type(item, "object", param)
    kind = (required if type_required else optional)(item, "type", "string", f"{param}.type") or FUNCTION
    if kind != FUNCTION:
        raise InvalidRequest(f"only function tools are supported, got type {kind!r}", param=f"{param}.type")
    return function_tool(required(item, "function", "object", f"{param}.function"), f"{param}.function")


def openai_tool_call(call: object, param: str, position: int, *, check_kind: bool = True) -> ToolCall:
    """A call in an assistant message's `tool_calls`. Its arguments may come as the JSON text (the OpenAI API)
    or as the parsed object (some clients, and Ollama's); absent, they are `{}`. `check_kind`: an optional
    `type` must say function (Ollama's calls have none, and it reads none)."""
    call = check_type(call, "object", param)
    kind = (optional(call, "type", "string", f"{param}.type") if check_kind else None) or FUNCTION
    if kind != FUNCTION:
        raise InvalidRequest(f"`{param}.type` must be 'function', got {kind!r}", param=f"{param}.type")
    function = required(call, "function", "object", f"{param}.function")
    name = required(function, "name", "string", f"{param}.function.name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif isinstance(arguments, dict):
        # re-serialized compactly and deterministically: the same call renders the same prompt every turn
        arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    elif not isinstance(arguments, str):
        raise InvalidRequest(f"`{param}.function.arguments` must be a string or an object, got "
                             f"{json_type_name(arguments)}", param=f"{param}.function.arguments")
    # a deterministic fallback id keeps the rendered prompt (and so the prefix cache) stable across turns and APIs
    call_id = optional(call, "id", "string", f"{param}.id") or f"call_{position}"
    return ToolCall(id=call_id, name=name, arguments=arguments)


def openai_choice_mode(raw: str, *, has_tools: bool, or_else: str) -> ToolChoice:
    """An OpenAI `tool_choice` string; `or_else`: what else the API takes (for the error)."""
    if raw not in OPENAI_CHOICE_MODES:
        raise InvalidRequest(f"`tool_choice` must be none, auto, required or {or_else}, got {raw!r}",
                             param="tool_choice")
    return tool_choice_mode(raw, has_tools=has_tools)


def tool_choice_mode(mode: str, *, has_tools: bool, shown: str | None = None) -> ToolChoice:
    """The canonical `mode` (none, auto, required); `shown`: the API's own name for it (Anthropic's 'any')."""
    if mode == "required" and not has_tools:
        raise InvalidRequest(f"tool_choice {shown or mode!r} needs at least one tool in `tools`", param="tool_choice")
    return ToolChoice(mode=mode)
