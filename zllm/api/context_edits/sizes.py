"""How many prompt tokens each message of a conversation takes, weighed with the served model's tokenizer.

    sizes = await TokenSizes.measure(engine, messages, tools, extra=(PLACEHOLDER,))
    sizes.message(messages[3])      # tokens of its content, reasoning and calls, plus a fixed framing estimate
    sizes.text("…")                 # any text measured above

Each text is tokenized alone (the template's framing is a fixed estimate per message and per call), so a
message weighs the same in every request that carries it: the edit rules replay the conversation's past turns
with these weights and must reach the same decisions every time they replay them (tool_uses.py). The total is
within a few tokens per message of the rendered prompt, close enough for thresholds in the thousands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Protocol

from zllm.canonical import FunctionTool, Message

# what a chat template wraps around one message (role markers, separators) and around one call: an estimate,
# the same every turn, so replayed decisions do not move
MESSAGE_FRAMING = 4
CALL_FRAMING = 6


class TextCounter(Protocol):
    async def count_text_tokens(self, texts: Sequence[str]) -> list[int]: ...


class TokenSizes:
    def __init__(self, table: dict[str, int], tools_tokens: int):
        self._table = table
        self.tools_tokens = tools_tokens  # the tool definitions: part of every prompt, never edited

    @classmethod
    async def measure(cls, counter: TextCounter, messages: Sequence[Message], tools: Sequence[FunctionTool],
                      extra: Iterable[str] = ()) -> TokenSizes:
        tool_texts = [_tool_text(tool) for tool in tools]
        texts = sorted({*_texts(messages), *tool_texts, *extra})
        table = dict(zip(texts, await counter.count_text_tokens(texts), strict=True))
        tools_tokens = sum(table[text] + MESSAGE_FRAMING for text in tool_texts)
        return cls(table, tools_tokens)

    def text(self, text: str) -> int:
        return self._table[text] if text else 0

    def message(self, message: Message) -> int:
        calls = sum(self.text(call.name) + self.text(call.arguments) + CALL_FRAMING for call in message.tool_calls)
        return MESSAGE_FRAMING + self.text(message.content) + self.text(message.reasoning or "") + calls


def _texts(messages: Sequence[Message]) -> set[str]:
    texts: set[str] = set()
    for message in messages:
        texts.update((message.content, message.reasoning or ""))
        for call in message.tool_calls:
            texts.update((call.name, call.arguments))
    texts.discard("")
    return texts


def _tool_text(tool: FunctionTool) -> str:
    return f"{tool.name}\n{tool.description}\n{json.dumps(tool.parameters, ensure_ascii=False)}"
