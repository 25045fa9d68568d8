"""Hermes / Qwen JSON tool calls on ChatML: `hermes` (SmolLM2 and any ChatML model) and `qwen3` (with thinking).

What the model writes (an assistant turn; literals in format.py, the parser parse.py, the fence grammar.py):

    <think>\\n{reasoning}\\n</think>\\n\\n                       (qwen3 only)
    {text}\\n<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>\\n<tool_call>\\n...

What `render` hands the chat template is described in render.py.

Qwen3 reasoning: assistant turns after the last user message render `<think>\\n{reasoning}\\n</think>\\n\\n`
(an empty block when the client sent no reasoning: that is what the model saw and wrote, so turn N+1's prompt
extends turn N's prompt and output); earlier turns drop it, as Qwen3's template does. With thinking off the
generation prompt ends `<think>\\n\\n</think>\\n\\n` (Qwen3's enable_thinking=False). Caveat: Qwen3's real
template re-splits `</think>` out of the content and drops an empty block of a non-final turn, so byte-exact
round trips hold with built-in ChatML or a plain ChatML template, not through that template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from zllm.canonical import FunctionTool, Message
from zllm.dialects.base import (
    ChatTemplate,
    Conversation,
    Dialect,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
    StreamParser,
)
from zllm.dialects.hermes.format import CALL_CLOSE, CALL_OPEN, THINK_CLOSE, THINK_OPEN
from zllm.dialects.hermes.grammar import fence_grammar
from zllm.dialects.hermes.parse import HermesParser
from zllm.dialects.hermes.render import chatml, plain_messages

THINKING_OFF_PROMPT = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"  # Qwen3's enable_thinking=False


class HermesJson(Dialect):
    """ChatML models with Hermes-style `<tool_call>` JSON: SmolLM2, Qwen2.5, any ChatML template."""

    name = "hermes"
    markup = (CALL_OPEN, CALL_CLOSE)

    def render(self, conversation: Conversation, template: ChatTemplate | None) -> str:
        messages = plain_messages(conversation, template, reasoning_block=self._reasoning_block(conversation))
        if template is None:
            return chatml(messages, add_generation_prompt=conversation.add_generation_prompt)
        return template(messages, add_generation_prompt=conversation.add_generation_prompt)

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        # every name is accepted in tags: an unknown tool comes back as a call the client can answer with an
        # error; a bare JSON object is a call only when it names a declared tool (else it is a JSON answer)
        return HermesParser(thinking=False, new_call_id=new_call_id, bare_tools=_names(tools))

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(replace(spec, thinking=False), markup)  # no reasoning block in this family

    def _reasoning_block(self, conversation: Conversation) -> Callable[[int, Message], str]:
        return lambda index, message: ""  # no reasoning in the prompt


class Qwen3Hermes(HermesJson):
    """Qwen3: Hermes tool calls plus `<think>` reasoning, on by default."""

    name = "qwen3"
    markup = (CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE)
    supports_thinking = True
    thinking_default = True

    def render(self, conversation: Conversation, template: ChatTemplate | None) -> str:
        text = super().render(conversation, template)
        if conversation.add_generation_prompt and not conversation.thinking:
            text += THINKING_OFF_PROMPT
        return text

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        return HermesParser(thinking=thinking, new_call_id=new_call_id, bare_tools=_names(tools))

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(spec, markup)

    def _reasoning_block(self, conversation: Conversation) -> Callable[[int, Message], str]:
        last_user = max((i for i, m in enumerate(conversation.messages) if m.role == "user"), default=-1)

        def block(index: int, message: Message) -> str:
            return f"<think>\n{message.reasoning or ''}\n</think>\n\n" if index > last_user else ""

        return block


def _names(tools: tuple[FunctionTool, ...]) -> frozenset[str]:
    return frozenset(tool.name for tool in tools)
