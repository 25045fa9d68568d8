"""GLM-4.5's XML tool dialect: GLM's own framing, `<tool_call>` with `<arg_key>`/`<arg_value>` pairs.

The prompt (written here, no chat template needed), for tools + system + user + a past call + its result:

    [gMASK]<sop><|system|>
    # Tools
    ...<tools>
    {"type": "function", "function": {"name": "get_weather", ...}}
    </tools>
    ...</tool_call><|system|>
    Be brief.<|user|>
    Weather in Paris?<|assistant|>
    <think>need the tool</think>
    Let me check.
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call><|observation|>
    <tool_response>
    sunny
    </tool_response><|assistant|>

What the model writes after `<|assistant|>` is the assistant turn's text above: `\n<think>…</think>`, `\n` + the
content, `\n<tool_call>…</tool_call>` per call; it then ends with `<|observation|>` (or `<|user|>` / EOS). With
thinking off the generation prompt is `<|assistant|>\n<think></think>` and user turns end with `/nothink`.
Reasoning is kept only for assistant turns after the last user turn (GLM's template drops earlier ones).

Argument values: a string parameter's value is raw text, anything else compact JSON (`[1, 2]`); the parser
types values from the tool schemas (see format.py) and streams the canonical JSON object.
"""

from __future__ import annotations

from collections.abc import Callable

from zllm.canonical import (
    FunctionTool,
)
from zllm.dialects.base import (
    ChatTemplate,
    Conversation,
    Dialect,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
    StreamParser,
)
from zllm.dialects.glm.format import MARKUP
from zllm.dialects.glm.grammar import fence_grammar
from zllm.dialects.glm.parse import GlmXmlParser
from zllm.dialects.glm.render import OBSERVATION, USER, render_prompt


class Glm45Xml(Dialect):
    name = "glm45"
    markup = MARKUP
    needs_chat_template = False  # GLM's framing is written here; a template, if any, is ignored
    end_of_turn = (OBSERVATION, USER)
    supports_thinking = True
    thinking_default = True

    def render(self, conversation: Conversation, template: ChatTemplate | None = None) -> str:
        return render_prompt(conversation)

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        return GlmXmlParser(tools, new_call_id)

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(spec, markup)
