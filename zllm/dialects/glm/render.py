"""GLM-4.5 prompt rendering: the framing, the tools block, past calls and results (see dialect.py)."""

from __future__ import annotations

import json

from zllm.canonical import (
    FunctionTool,
    Message,
    ToolCall,
)
from zllm.dialects.bare_json import bare_call_text, opens_bare
from zllm.dialects.base import (
    Conversation,
)
from zllm.dialects.glm.format import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    VALUE_CLOSE,
    VALUE_OPEN,
    param_schemas,
    string_param,
    value_text,
)

PROMPT_PREFIX = "[gMASK]<sop>"
SYSTEM, USER, ASSISTANT, OBSERVATION = "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"
NO_THINK = "/nothink"
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)


def render_prompt(conversation: Conversation) -> str:
    tools = {tool.name: tool for tool in conversation.tools}
    parts = [PROMPT_PREFIX]
    if conversation.tools:
        parts.append(SYSTEM + "\n" + TOOLS_PREAMBLE + "".join(_tool_json(t) + "\n" for t in conversation.tools)
                     + TOOLS_POSTAMBLE)
    messages = conversation.messages
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    for i, message in enumerate(messages):
        if message.role == "user":
            suffix = NO_THINK if not conversation.thinking and not message.content.endswith(NO_THINK) else ""
            parts.append(f"{USER}\n{message.content}{suffix}")
        elif message.role == "system":
            parts.append(f"{SYSTEM}\n{message.content}")
        elif message.role == "assistant":
            parts.append(ASSISTANT + render_assistant_turn(message, tools, keep_reasoning=i > last_user))
        else:
            opens = i == 0 or messages[i - 1].role != "tool"
            parts.append(f"{OBSERVATION if opens else ''}\n<tool_response>\n{message.content}\n</tool_response>")
    if conversation.add_generation_prompt:
        parts.append(ASSISTANT + ("" if conversation.thinking else f"\n{THINK_OPEN}{THINK_CLOSE}"))
    return "".join(parts)


def render_assistant_turn(message: Message, tools: dict[str, FunctionTool], *, keep_reasoning: bool) -> str:
    """The text after `<|assistant|>`: exactly what the model writes for this turn."""
    reasoning, content = message.reasoning, message.content
    if reasoning is None and THINK_CLOSE in content:  # reasoning left inline in the content, as GLM's template reads it
        before, _, _ = content.partition(THINK_CLOSE)
        reasoning = before.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
        content = content.split(THINK_CLOSE)[-1].lstrip("\n")
    kept = reasoning.strip() if keep_reasoning and reasoning else ""
    text = f"\n{THINK_OPEN}{kept}{THINK_CLOSE}"
    calls, bare = message.tool_calls, opens_bare(message)
    if bare is not None:  # the model wrote it as a bare JSON object opening its content (bare_json.py)
        content, calls = bare_call_text(bare), calls[1:]
    if content.strip():
        text += "\n" + content.strip()
    return text + "".join("\n" + render_call(call, tools.get(call.name)) for call in calls)


def render_call(call: ToolCall, tool: FunctionTool | None) -> str:
    schemas = param_schemas(tool)
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    pairs = arguments.items() if isinstance(arguments, dict) else ()  # not an object: nothing GLM can write
    body = "".join(f"{KEY_OPEN}{key}{KEY_CLOSE}\n{VALUE_OPEN}{value_text(value, string_param(tool, schemas, key))}"
                   f"{VALUE_CLOSE}\n" for key, value in pairs)
    return f"{CALL_OPEN}{call.name}\n{body}{CALL_CLOSE}"


def _tool_json(tool: FunctionTool) -> str:
    function = {"name": tool.name, **({"description": tool.description} if tool.description else {}),
                "parameters": tool.parameters}
    return json.dumps({"type": "function", "function": function}, ensure_ascii=False)
