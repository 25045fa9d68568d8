"""OpenAI harmony, gpt-oss's format (`harmony`): the dialect the registry names for o200k_harmony vocabularies.

What the model writes after the prompt's `<|start|>assistant` (literals in format.py):

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>

render.py writes the prompt as gpt-oss's template does (no Jinja needed), parse.py reads the output (analysis →
reasoning, final → text, a commentary message to `functions.NAME` → a call), grammar.py is the fence. The turn
ends at `<|call|>` or `<|return|>` (stop tokens, so the parser never sees them: finish() closes an open call);
`<|end|>` ends a message only and must never stop generation (`continues_turn`), though a generic rule
(Phi-3's end of turn is also `<|end|>`) would make it a stop token. gpt-oss always reasons; the client's
effort sets the system message's `Reasoning:` level, and effort "none" also fences the analysis out.
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
from zllm.dialects.harmony.format import CALL, END, MARKUP, RETURN
from zllm.dialects.harmony.grammar import fence_grammar
from zllm.dialects.harmony.parse import HarmonyParser
from zllm.dialects.harmony.render import render_prompt


class Harmony(Dialect):
    name: ClassVar[str] = "harmony"
    markup: ClassVar[tuple[str, ...]] = MARKUP
    single_token_markup: ClassVar[tuple[str, ...]] = MARKUP
    end_of_turn: ClassVar[tuple[str, ...]] = (CALL, RETURN)
    continues_turn: ClassVar[tuple[str, ...]] = (END,)
    single_call: ClassVar[bool] = True  # `<|call|>` ends the generation: one call per turn the model writes
    supports_thinking: ClassVar[bool] = True
    thinking_default: ClassVar[bool] = True
    needs_chat_template: ClassVar[bool] = False

    def render(self, conversation: Conversation, template: ChatTemplate | None) -> str:
        return render_prompt(conversation)

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        return HarmonyParser(new_call_id=new_call_id)

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(spec, markup)
