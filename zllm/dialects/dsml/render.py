"""DeepSeek V3.2 / V4 prompt text, written without a chat template (the families ship Python encoders instead).

V3.2, thinking on (the official encoding test vector, abridged):

    <｜begin▁of▁sentence｜>SYSTEM\\n\\n## Tools ... <functions>\\n{tool json}\\n</functions>\\n
    <｜User｜>Q1<｜Assistant｜></think>\\n\\n<｜DSML｜function_calls>...</｜DSML｜function_calls><｜end▁of▁sentence｜>
    \\n\\n<function_results>\\n<result>R</result>\\n</function_results>\\n\\n</think>ANSWER<｜end▁of▁sentence｜>
    <｜User｜>Q2<｜Assistant｜><think>KEPT REASONING</think>\\n\\n<｜DSML｜function_calls>...

- the assistant opener belongs to the turn before it: a user turn ends `<｜Assistant｜>` + `<think>` (thinking, and
  it is the last user turn) or `</think>`; tool results end `\\n\\n<think>` / `\\n\\n</think>` the same way.
- reasoning is written (`REASONING</think>`) only for assistant turns after the last user turn.

V4 differs: the block is `<｜DSML｜tool_calls>`, the tools prompt is reworded, tool results become a user turn
(`<｜User｜><tool_result>R1</tool_result>\\n\\n<tool_result>R2</tool_result><｜Assistant｜><think>`, in call order,
merged with adjacent user text), and when tools are declared every turn keeps its reasoning.

`add_generation_prompt=False` leaves out the trailing opener, so the text is a prefix of the full prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from zllm.canonical import FunctionTool, Message
from zllm.dialects.base import Conversation
from zllm.dialects.dsml.format import (
    ASSISTANT,
    BLOCK_SEPARATOR,
    BOS,
    EOS,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    DsmlTags,
    render_block,
)

V32_TOOLS_PROMPT = """## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<｜DSML｜function_calls>" block like the following as part of your reply to the user:
<｜DSML｜function_calls>
<｜DSML｜invoke name="$FUNCTION_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$FUNCTION_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:

<｜DSML｜function_calls>
...
</｜DSML｜function_calls>

<function_results>
...
</function_results>

<think>...thinking about results</think>

Here are the functions available in JSONSchema format:
<functions>
{tool_schemas}
</functions>
"""

V4_TOOLS_PROMPT = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


@dataclass(frozen=True)
class DsmlFamily:
    """What differs between DeepSeek generations that speak DSML."""

    block: str
    tools_prompt: str
    # V3.2: `<function_results>` appended to the assistant turn; V4: `<tool_result>` blocks in a user turn
    results: Literal["function_results", "user_tool_result"]
    # V4 keeps every turn's reasoning when tools are declared (its encoder turns drop_thinking off then)
    keep_reasoning_with_tools: bool

    @property
    def tags(self) -> DsmlTags:
        return DsmlTags(self.block)


V32 = DsmlFamily("function_calls", V32_TOOLS_PROMPT, "function_results", keep_reasoning_with_tools=False)
V4 = DsmlFamily("tool_calls", V4_TOOLS_PROMPT, "user_tool_result", keep_reasoning_with_tools=True)


def render_prompt(family: DsmlFamily, conversation: Conversation) -> str:
    messages = _with_system_for_tools(conversation)
    render = _render_v32 if family.results == "function_results" else _render_v4
    return BOS + "".join(render(family, conversation, messages))


def assistant_output(family: DsmlFamily, message: Message, *, with_reasoning: bool) -> str:
    """An assistant turn as the model writes it (after the prompt's opener, before EOS)."""
    reasoning = f"{message.reasoning or ''}{THINK_CLOSE}" if with_reasoning else ""
    calls = ""
    if message.tool_calls:
        calls = BLOCK_SEPARATOR + render_block(family.tags, [(c.name, c.arguments) for c in message.tool_calls])
    return reasoning + message.content + calls


def tools_prompt(family: DsmlFamily, tools: tuple[FunctionTool, ...]) -> str:
    schemas = "\n".join(json.dumps(_tool_schema(tool), ensure_ascii=False) for tool in tools)
    return family.tools_prompt.replace("{tool_schemas}", schemas)


def _tool_schema(tool: FunctionTool) -> dict:
    # the OpenAI `function` object as DeepSeek's encoder dumps it (an absent description stays absent)
    schema: dict = {"name": tool.name}
    if tool.description:
        schema["description"] = tool.description
    schema["parameters"] = tool.parameters
    return schema


def _with_system_for_tools(conversation: Conversation) -> list[Message]:
    """Tools ride on the first system turn; without one, an empty system turn carries them."""
    messages = list(conversation.messages)
    if conversation.tools and (not messages or messages[0].role != "system"):
        messages.insert(0, Message(role="system", content=""))
    return messages


def _system_text(family: DsmlFamily, conversation: Conversation, message: Message, first: bool) -> str:
    if first and conversation.tools:
        return f"{message.content}\n\n{tools_prompt(family, conversation.tools)}"
    return message.content


def _think_token(opens_reasoning: bool) -> str:
    return THINK_OPEN if opens_reasoning else THINK_CLOSE


def _last_index(roles: list[str], role: str) -> int:
    return max((i for i, r in enumerate(roles) if r == role), default=-1)


# ---------------------------------------------------------------------------------------------- V3.2


def _render_v32(family: DsmlFamily, conversation: Conversation, messages: list[Message]):
    thinking = conversation.thinking
    last_user = _last_index([m.role for m in messages], "user")
    for i, message in enumerate(messages):
        is_last = i == len(messages) - 1
        opener = not is_last or conversation.add_generation_prompt
        if message.role == "system":
            yield _system_text(family, conversation, message, i == 0)
        elif message.role == "user":
            yield USER + message.content
            if opener:
                yield ASSISTANT + _think_token(thinking and i == last_user)
        elif message.role == "tool":
            yield from _v32_result(messages, i, opener, thinking and i >= last_user)
        else:
            yield assistant_output(family, message, with_reasoning=thinking and i > last_user) + EOS


def _v32_result(messages: list[Message], i: int, opener: bool, opens_reasoning: bool):
    """One result of a run of tool messages; the run is wrapped in one `<function_results>` element."""
    if i == 0 or messages[i - 1].role != "tool":
        yield "\n\n<function_results>"
    yield f"\n<result>{messages[i].content}</result>"
    if i == len(messages) - 1 or messages[i + 1].role != "tool":
        yield "\n</function_results>"
        if opener:
            yield "\n\n" + _think_token(opens_reasoning)


# ------------------------------------------------------------------------------------------------ V4


@dataclass
class _Turn:
    """A V4 turn: tool results and adjacent user text merge into one user turn of blocks."""

    role: str
    message: Message | None = None
    blocks: list[str] = field(default_factory=list)


def _merge_v4(messages: list[Message]) -> list[_Turn]:
    turns: list[_Turn] = []
    call_order: dict[str, int] = {}
    for message in messages:
        if message.role in ("user", "tool"):
            if not turns or turns[-1].role != "user":
                turns.append(_Turn("user"))
            turns[-1].blocks.append(message if message.role == "tool" else message.content)
            continue
        if turns and turns[-1].role == "user":
            _finish_user_turn(turns[-1], call_order)
        if message.tool_calls:
            call_order = {call.id: n for n, call in enumerate(message.tool_calls)}
        turns.append(_Turn(message.role, message))
    if turns and turns[-1].role == "user":
        _finish_user_turn(turns[-1], call_order)
    return turns


def _finish_user_turn(turn: _Turn, call_order: dict[str, int]) -> None:
    """Tool results in the order of the calls that asked for them (their slots among the blocks kept)."""
    results = [b for b in turn.blocks if isinstance(b, Message)]
    ordered = iter(sorted(results, key=lambda m: call_order.get(m.tool_call_id or "", 0)))
    turn.blocks = [f"<tool_result>{next(ordered).content}</tool_result>" if isinstance(b, Message) else b
                   for b in turn.blocks]


def _render_v4(family: DsmlFamily, conversation: Conversation, messages: list[Message]):
    thinking = conversation.thinking
    keep_all = family.keep_reasoning_with_tools and bool(conversation.tools)
    turns = _merge_v4(messages)
    last_user = _last_index([t.role for t in turns], "user")
    for i, turn in enumerate(turns):
        is_last = i == len(turns) - 1
        if turn.role == "system":
            yield _system_text(family, conversation, turn.message, i == 0)
        elif turn.role == "user":
            yield USER + "\n\n".join(turn.blocks)
            opener = conversation.add_generation_prompt if is_last else turns[i + 1].role == "assistant"
            if opener:
                yield ASSISTANT + _think_token(thinking and (keep_all or i >= last_user))
        else:
            with_reasoning = thinking and (keep_all or i > last_user)
            yield assistant_output(family, turn.message, with_reasoning=with_reasoning) + EOS
