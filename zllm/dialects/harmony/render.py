"""Harmony prompt text, written as gpt-oss's chat template writes it (tests/golden/gpt-oss/, compared token for
token in tests/unit/dialects/test_harmony_render.py):

    <|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\nKnowledge cutoff: 2024-06
    \\nCurrent date: YYYY-MM-DD\\n\\nReasoning: medium\\n\\n# Valid channels: analysis, commentary, final. Channel must
    be included for every message.\\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>
    <|start|>developer<|message|># Instructions\\n\\nSYSTEM TEXT\\n\\n# Tools\\n\\n## functions\\n\\nnamespace functions {
    \\n\\n// DESCRIPTION\\ntype NAME = (_: {\\n// PARAM DESCRIPTION\\nPARAM?: TYPE,\\n}) => any;\\n\\n} // namespace functions<|end|>
    <|start|>user<|message|>Q<|end|>
    <|start|>assistant<|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{"k": "v"}<|call|>
    <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"RESULT AS A JSON STRING"<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|end|>
    <|start|>assistant

- the client's reasoning effort is the system message's `Reasoning:` level (format.effort_level);
- the first system message becomes the developer message's instructions;
- a turn's reasoning is kept only on the messages that call tools, and only until an answer (an assistant
  message without calls) follows them: an answered turn's analysis is dropped, as the template drops it;
- the last message, when it is an answer and no generation prompt follows, ends `<|return|>` after its analysis.

Where the template cannot hold what a client sends, this renders it rather than drop it: every call of an
assistant message (the template writes only the first), a result named after the call it answers, a later
system message as a developer message, reasoning and text together (text as a commentary preamble).
"""

from __future__ import annotations

import json
import time
from typing import Any

from zllm.canonical import FunctionTool, Message
from zllm.dialects.base import Conversation, canonical_arguments
from zllm.dialects.harmony.format import (
    ANALYSIS,
    ASSISTANT,
    CALL,
    CHANNEL,
    COMMENTARY,
    END,
    FINAL,
    MESSAGE,
    RETURN,
    START,
    call_header,
    effort_level,
)

MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
CHANNELS_LINE = "# Valid channels: analysis, commentary, final. Channel must be included for every message."
FUNCTIONS_LINE = "\nCalls to these tools must go to the commentary channel: 'functions'."
# the template's whitespace inside nested types and oneOf defaults (its Jinja indentation, kept verbatim)
NESTED_INDENT = "\n" + " " * 16
ONEOF_DEFAULT_INDENT = " " * 20


def today() -> str:
    """The template's `strftime_now("%Y-%m-%d")`: the prompt changes once a day, as it does under the template."""
    return time.strftime("%Y-%m-%d")


def render_prompt(conversation: Conversation, *, date: str | None = None) -> str:
    messages = list(conversation.messages)
    instructions = ""
    if messages and messages[0].role == "system":
        instructions = messages.pop(0).content
    parts = [system_message(conversation, date or today())]
    if instructions or conversation.tools:
        parts.append(developer_message(instructions, conversation.tools))
    parts.extend(_turns(messages, add_generation_prompt=conversation.add_generation_prompt))
    if conversation.add_generation_prompt:
        parts.append(START + ASSISTANT)
    return "".join(parts)


def system_message(conversation: Conversation, date: str) -> str:
    text = (f"{MODEL_IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\nCurrent date: {date}\n\n"
            f"Reasoning: {effort_level(conversation.reasoning_effort)}\n\n{CHANNELS_LINE}")
    if conversation.tools:
        text += FUNCTIONS_LINE
    return f"{START}system{MESSAGE}{text}{END}"


def developer_message(instructions: str, tools: tuple[FunctionTool, ...]) -> str:
    text = f"# Instructions\n\n{instructions}\n\n" if instructions else ""
    if tools:
        text += "# Tools\n\n" + tool_namespace(tools)
    return f"{START}developer{MESSAGE}{text}{END}"


def assistant_message(channel: str, body: str, end: str = END, header: str = "") -> str:
    return f"{START}{ASSISTANT}{header}{CHANNEL}{channel}{MESSAGE}{body}{end}"


def answer_output(message: Message) -> str:
    """What the model writes for an answer after the prompt's `<|start|>assistant`, through `<|return|>`. Not a
    suffix of any later prompt: once answered, the turn's analysis is dropped and `<|return|>` becomes `<|end|>`."""
    analysis = assistant_message(ANALYSIS, message.reasoning) if message.reasoning is not None else ""
    return (analysis + assistant_message(FINAL, message.content, RETURN))[len(START + ASSISTANT):]


def call_message(name: str, arguments: str) -> str:
    return f"{START}{ASSISTANT}{call_header(name)}{canonical_arguments(arguments)}{CALL}"


def _turns(messages: list[Message], *, add_generation_prompt: bool):
    last_call_name: str | None = None
    names: dict[str, str] = {}
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            answered = any(m.role == "assistant" and not m.tool_calls for m in messages[i + 1:])
            yield from _calling_message(message, answered)
            names.update({call.id: call.name for call in message.tool_calls})
            last_call_name = message.tool_calls[0].name
        elif message.role == "assistant":
            if i == len(messages) - 1 and not add_generation_prompt:
                if message.reasoning is not None:
                    yield assistant_message(ANALYSIS, message.reasoning)
                yield assistant_message(FINAL, message.content, RETURN)
            else:
                yield assistant_message(FINAL, message.content)
            last_call_name = None
        elif message.role == "tool":
            name = names.get(message.tool_call_id or "") or last_call_name or message.name or "unknown"
            body = json.dumps(message.content, ensure_ascii=False)
            yield f"{START}functions.{name} to={ASSISTANT}{CHANNEL}{COMMENTARY}{MESSAGE}{body}{END}"
        elif message.role == "user":
            yield f"{START}user{MESSAGE}{message.content}{END}"
        else:  # a later system message: the template would drop it
            yield f"{START}developer{MESSAGE}{message.content}{END}"


def _calling_message(message: Message, answered: bool):
    """Analysis (the template writes the message's text there when it has no reasoning), then each call."""
    if message.reasoning and message.content:
        if not answered:
            yield assistant_message(ANALYSIS, message.reasoning)
        yield assistant_message(COMMENTARY, message.content)
    elif (message.content or message.reasoning) and not answered:
        yield assistant_message(ANALYSIS, message.content or message.reasoning)
    for call in message.tool_calls:
        yield call_message(call.name, call.arguments)


# ------------------------------------------------------------------------------- the tools' TypeScript


def tool_namespace(tools: tuple[FunctionTool, ...]) -> str:
    body = "".join(_tool(tool) for tool in tools)
    return f"## functions\n\nnamespace functions {{\n\n{body}}} // namespace functions"


def _tool(tool: FunctionTool) -> str:
    head = f"// {tool.description or ''}\ntype {tool.name} = "
    parameters = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = parameters.get("properties")
    if not (parameters and properties):
        return head + "() => any;\n\n"
    required = parameters.get("required") or []
    lines = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        line = f"// {spec['description']}\n" if spec.get("description") else ""
        line += f"{name}{'' if name in required else '?'}: {typescript_type(spec)}"
        if "default" in spec:
            default = spec["default"]
            if spec.get("enum"):
                line += f", // default: {default}"
            elif spec.get("oneOf"):
                line += f"// default: {default}"
            else:
                line += f", // default: {_tojson(default)}"
        lines.append(line + ",\n")
    return head + "(_: {\n" + "".join(lines) + "}) => any;\n\n"


def typescript_type(spec: Any) -> str:
    """The template's `render_typescript_type`, quirks included (its `has_object_variants` is set inside a
    loop, which Jinja scopes to the loop: a oneOf is always written out variant by variant)."""
    if not isinstance(spec, dict):
        return "any"
    kind = spec.get("type")
    if kind == "array":
        return _array_type(spec) + (" | null" if spec.get("nullable") else "")
    if isinstance(kind, (list, tuple)) and kind:
        return " | ".join(str(k) for k in kind) if len(kind) > 1 else str(kind[0])
    if spec.get("oneOf"):
        return "".join(_variant(variant, last=n == len(spec["oneOf"]) - 1) for n, variant in enumerate(spec["oneOf"]))
    if kind == "string":
        if spec.get("enum"):
            return '"' + '" | "'.join(str(v) for v in spec["enum"]) + '"'
        return "string" + (" | null" if spec.get("nullable") else "")
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        properties = spec.get("properties")
        if not properties:
            return "object"
        required = spec.get("required") or []
        fields = ", ".join(f"{name}{'' if name in required else '?'}: {NESTED_INDENT}{typescript_type(sub)}"
                           for name, sub in properties.items())
        return "{\n" + fields + "}"
    return "any"


def _array_type(spec: dict) -> str:
    items = spec.get("items")
    if not items:
        return "any[]"
    item_kind = items.get("type") if isinstance(items, dict) else None
    simple = {"string": "string[]", "number": "number[]", "integer": "number[]", "boolean": "boolean[]"}
    if isinstance(item_kind, str) and item_kind in simple:
        return simple[item_kind]
    inner = typescript_type(items)
    return "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"


def _variant(variant: Any, *, last: bool) -> str:
    text = typescript_type(variant)
    if isinstance(variant, dict):
        if variant.get("description"):
            text += "// " + str(variant["description"])
        if "default" in variant:
            text += ONEOF_DEFAULT_INDENT + "// default: " + _tojson(variant["default"])
    return text if last else text + " | \n"


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
