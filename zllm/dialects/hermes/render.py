"""Hermes / Qwen prompt rendering: the conversation as plain ChatML messages with the tool markup written in.

What `render` hands the chat template: plain `{"role", "content"}` messages, byte for byte what Qwen2.5's own
template renders from `tools=` and `tool_calls` (tests/support/tiny_models.py QWEN25_CHAT_TEMPLATE):

    system     {system text}\\n\\n# Tools\\n\\nYou may call one or more functions ...<tools>\\n{tool json}\\n...
               </tools>\\n\\nFor each function call, return a json object ... </tool_call>
    assistant  {text} + per call ("\\n" when anything precedes it) + <tool_call>\\n{"name": ..., "arguments": ...}
               \\n</tool_call>, arguments in `canonical_arguments` spelling; a call the model wrote as a bare
               JSON object opening the turn (`ToolCall.form`, parse.py) is written back bare, as it was
    user       <tool_response>\\n{result}\\n</tool_response>, joined by "\\n", for each run of tool messages

With tools and no system message the system text is the template's own default system prompt (found by
rendering a probe conversation with and without a system message: Qwen2.5's "You are Qwen, created by Alibaba
Cloud. ...", SmolLM2's "You are a helpful AI assistant named SmolLM ...") then "\\n\\n" and the tools block, as
Qwen2.5's template does; a template without a default (Qwen3) gets the tools block alone. Without a template
the framing is built-in ChatML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from zllm.canonical import BARE_JSON_PARAMETERS, CALL_FORMS, FunctionTool, Message, ToolCall
from zllm.dialects.base import ChatTemplate, Conversation, canonical_arguments
from zllm.dialects.hermes.format import CALL_CLOSE, CALL_OPEN

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
_PROBE_USER = "zllm-probe-user-7f3a"
_PROBE_SYSTEM = "zllm-probe-system-7f3a"


def plain_messages(conversation: Conversation, template: ChatTemplate | None, *,
                   reasoning_block: Callable[[int, Message], str]) -> list[dict[str, str]]:
    """The conversation as plain ChatML messages with the tool markup written into their content."""
    messages = list(enumerate(conversation.messages))
    out: list[dict[str, str]] = []
    if conversation.tools:
        if messages and messages[0][1].role == "system":
            system = messages.pop(0)[1].content + "\n\n"
        else:
            default = template_default_system(template)
            system = default + "\n\n" if default else ""
        out.append({"role": "system", "content": system + tools_block(conversation.tools)})
    for run in _runs(messages):
        index, first = run[0]
        if first.role == "tool":
            out.append({"role": "user", "content": "\n".join(tool_result_text(m) for _, m in run)})
        elif first.role == "assistant":
            out.append({"role": "assistant", "content": reasoning_block(index, first) + assistant_text(first)})
        else:
            out.append({"role": first.role, "content": first.content})
    return out


def _runs(messages: list[tuple[int, Message]]) -> Iterator[list[tuple[int, Message]]]:
    """Each message alone, except that consecutive tool results form one run (one user turn)."""
    run: list[tuple[int, Message]] = []
    for item in messages:
        if run and not (run[-1][1].role == "tool" and item[1].role == "tool"):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


def tools_block(tools: tuple[FunctionTool, ...]) -> str:
    """As transformers' `tojson` writes each tool: json.dumps, non-ASCII kept, default separators."""
    lines = "".join("\n" + json.dumps(tool_spec(tool), ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def tool_spec(tool: FunctionTool) -> dict:
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def assistant_text(message: Message) -> str:
    """Content, then each call; a call is preceded by "\\n" when anything precedes it."""
    text = message.content
    for call in message.tool_calls:
        if not text and call.form in CALL_FORMS:  # only the turn's opening can be a bare call
            text = bare_call_text(call)
        else:
            text += ("\n" if text else "") + tool_call_text(call)
    return text


def tool_call_text(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n{bare_call_text(call, key='arguments')}\n{CALL_CLOSE}"


def bare_call_text(call: ToolCall, key: str | None = None) -> str:
    """The call's JSON object; its arguments key as the model wrote it (`call.form`) unless given."""
    key = key or ("parameters" if call.form == BARE_JSON_PARAMETERS else "arguments")
    name = json.dumps(call.name, ensure_ascii=False)
    return f'{{"name": {name}, "{key}": {canonical_arguments(call.arguments)}}}'


def tool_result_text(message: Message) -> str:
    return f"<tool_response>\n{message.content}\n</tool_response>"


def chatml(messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def template_default_system(template: ChatTemplate | None) -> str:
    """The system prompt `template` renders when a conversation has none ("" when it renders none).

    Rendered with and without a probe system message: where the probe sits in the one, the default sits in the
    other, between the same prefix and suffix."""
    if template is None:
        return ""
    user = {"role": "user", "content": _PROBE_USER}
    try:
        without = template([user], add_generation_prompt=False)
        with_probe = template([{"role": "system", "content": _PROBE_SYSTEM}, user], add_generation_prompt=False)
    except Exception:  # a template that insists on its own shape: no default to keep
        return ""
    prefix, found, suffix = with_probe.partition(_PROBE_SYSTEM)
    if not found or len(without) < len(prefix) + len(suffix):
        return ""
    if not (without.startswith(prefix) and without.endswith(suffix)):
        return ""
    return without[len(prefix):len(without) - len(suffix)]
