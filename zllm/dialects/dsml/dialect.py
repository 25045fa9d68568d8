"""DeepSeek V3.2 and V4: DSML tool calls, `<think>` reasoning, prompts written without a chat template.

What the model writes (V3.2, thinking on: the prompt ends `<｜Assistant｜><think>`, so output starts inside
the reasoning; V4 writes `tool_calls` where V3.2 writes `function_calls`):

    The user wants the weather.</think>Let me check.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">San Francisco</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls><｜end▁of▁sentence｜>

Pieces: format.py (literals, value rules), render.py (the prompt), parse.py (output → events),
grammar.py (the fence). On the V3.1/V3.2 vocabulary `｜DSML｜` is four ordinary tokens; on V4's it is one
added token, which the fence must name by id (`single_token_markup`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from zllm.canonical import FunctionTool
from zllm.dialects.base import (
    ChatTemplate,
    Conversation,
    Dialect,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
    StreamParser,
)
from zllm.dialects.dsml.format import DSML, THINK_CLOSE, THINK_OPEN
from zllm.dialects.dsml.grammar import fence_grammar
from zllm.dialects.dsml.parse import DsmlStreamParser
from zllm.dialects.dsml.render import V4, V32, DsmlFamily, render_prompt


class _DeepSeekDsml(Dialect):
    family: ClassVar[DsmlFamily]
    markup: ClassVar[tuple[str, ...]] = (THINK_OPEN, THINK_CLOSE, DSML)
    supports_thinking: ClassVar[bool] = True
    thinking_default: ClassVar[bool] = False
    needs_chat_template: ClassVar[bool] = False

    def render(self, conversation: Conversation, template: ChatTemplate | None) -> str:
        # the family ships no usable chat template: the dialect writes the whole prompt
        return render_prompt(self.family, conversation)

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        return DsmlStreamParser(tools, thinking=thinking, new_call_id=new_call_id)

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(spec, markup, family=self.family)


class DeepSeekV32Dsml(_DeepSeekDsml):
    """DeepSeek V3.2 (and V3.1-vocabulary models trained on its format): `<｜DSML｜function_calls>`."""

    name: ClassVar[str] = "deepseek-v3.2"
    family: ClassVar[DsmlFamily] = V32


class DeepSeekV4Dsml(_DeepSeekDsml):
    """DeepSeek V4: `<｜DSML｜tool_calls>`, tool results as user turns; `｜DSML｜` is one added token."""

    name: ClassVar[str] = "deepseek-v4"
    family: ClassVar[DsmlFamily] = V4
    single_token_markup: ClassVar[tuple[str, ...]] = (DSML,)
