"""A conversation rendered by the model's own template: tools, calls, results and reasoning as the template
writes them (so the prompt is byte for byte what the model was trained on, and a call the model wrote comes
back in the next turn's prompt exactly as written, when the parser and the fence follow the derived format; a call
the model wrote as a bare JSON object opening its turn comes back as that turn's text, bare, as written, unless
the template refuses tool results after a turn without calls: then in the family's markup, and the cache forks)."""

from __future__ import annotations

import json

import jinja2

from zllm.canonical import FunctionTool, Message, ToolCall
from zllm.dialects.bare_json import bare_call_text, opens_bare, reads_bare
from zllm.dialects.base import Conversation
from zllm.dialects.derived.format import CallFormat
from zllm.dialects.derived.ids import template_id
from zllm.dialects.derived.jinja import JinjaChatTemplate


def render_conversation(template: JinjaChatTemplate, conversation: Conversation, fmt: CallFormat | None = None,
                        **variables) -> str:
    tools = [tool_spec(tool) for tool in conversation.tools] or None
    try:
        return _render_with(template, conversation, fmt, tools, variables)
    except (jinja2.TemplateError, TypeError) as exc:
        failure = exc
    # a template that reads what a tool may leave out: every parameter's description, a list of tools even where
    # there are none (Command R+ iterates over `tools` and writes each `param_fields.description`): given "" and []
    try:
        return _render_with(template, conversation, fmt, [_described(tool) for tool in tools or ()], variables)
    except (jinja2.TemplateError, TypeError):
        raise failure from None


def _described(tool: dict) -> dict:
    """`tool` with an empty description on every parameter that has none."""
    function = tool["function"]
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return tool
    described = {key: {**value, "description": value.get("description", "")} if isinstance(value, dict) else value
                 for key, value in properties.items()}
    return {**tool, "function": {**function, "parameters": {**parameters, "properties": described}}}


def _render_with(template: JinjaChatTemplate, conversation: Conversation, fmt: CallFormat | None,
                 tools: list[dict] | None, variables: dict) -> str:
    def render(bare: bool) -> str:
        return template([message_dict(m, fmt, bare=bare) for m in conversation.messages], tools=tools,
                        add_generation_prompt=conversation.add_generation_prompt, **variables)

    if fmt is None or not any(opens_bare(m) for m in conversation.messages):
        return render(False)
    try:
        text = render(True)
    except jinja2.TemplateError:
        # the template refuses results that follow no call (MiniMax M2: "no previous assistant message with a
        # tool call"): the bare call is written in the family's markup, and the prompt forks at that turn
        return render(False)
    if not all(m.content in text for m in conversation.messages if m.role == "tool"):
        # the template drops results that follow no call (Gemma 4 attaches them to its calls): the model must
        # see every result, so the call is written in the family's markup, and the prompt forks at that turn
        return render(False)
    return text


def message_dict(message: Message, fmt: CallFormat | None = None, *, bare: bool = False) -> dict:
    """`bare`: a call the model wrote as a bare JSON object opening its turn is given as the turn's text."""
    ids = (lambda call_id: template_id(call_id, fmt)) if fmt is not None else (lambda call_id: call_id)
    content, calls = message.content, message.tool_calls
    bare = opens_bare(message) if bare and fmt is not None and reads_bare(fmt.section_open + fmt.call_open) else None
    if bare is not None:  # the model wrote it as a bare JSON object (bare_json.py): the turn's text, as written
        content, calls = bare_call_text(bare), calls[1:]
    if calls and fmt is not None and fmt.calls_drop_text:
        content = ""  # the template would drop the calls beside it (format.py `calls_drop_text`): the text goes
    out: dict = {"role": message.role, "content": content}
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if calls:
        text = fmt is not None and fmt.text_arguments
        out["tool_calls"] = [{**call_dict(call, as_text=text), "id": ids(call.id)} for call in calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = ids(message.tool_call_id)
    if message.name is not None:
        out["name"] = message.name
    return out


def call_dict(call: ToolCall, *, as_text: bool = False) -> dict:
    """`as_text`: the template takes the arguments as JSON text (format.py `text_arguments`): given in the
    canonical spelling, as a template's `tojson` writes an object."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments  # not JSON: given to the template as the text the model wrote
    else:
        if as_text:
            arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def tool_spec(tool: FunctionTool) -> dict:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": function}
