"""The Dialect contract: one object per model family owns how tools look in that family's text.

A dialect does four things and derives a fifth from the same declaration:

1. `render` — the whole prompt text for a conversation: tool instructions injected (usually into the system
   turn), past tool calls rendered as the model itself writes them, tool results as the family expects them,
   reasoning of earlier turns kept or dropped as the family does. A template-based family (Hermes on ChatML)
   pre-renders tool markup into plain `{"role", "content"}` messages and lets the model's own chat template do
   the framing; a family without a usable template (DeepSeek DSML, GLM stand-ins) writes the framing itself.
2. `parser` — an incremental `StreamParser`: text pieces in (as the detokenizer produces them), canonical
   events out (TextDelta, ReasoningDelta, ToolCallStart / ToolCallArgsDelta / ToolCallEnd).
3. `fence_grammar` — the llguidance Lark grammar that constrains sampling for one request (tool_choice, tool
   schemas, response schema, thinking), built from the same literals the parser scans for.

Invariants every dialect is tested for (tests/unit/dialects/):
- render ⇄ parse are inverses: parsing the text `render` writes for an assistant turn gives back that turn's
  content, reasoning and calls; rendering a parsed model output gives back the model's text byte for byte
  (so turn N+1's prompt starts with turn N's prompt + output: the prefix cache hits).
- the parser is split-invariant: whole, piece by piece and in random groupings, the events are the same once
  adjacent deltas of one kind are merged; it never emits part of a tag as text.
- `finish()` closes what is open: held-back text is flushed as text, an open call ends with ToolCallEnd
  carrying the arguments produced so far (nothing the model wrote is lost).

Arguments travel as JSON object text (canonical `ToolCall.arguments`). Families that write arguments as
key/value markup convert both ways; `canonical_arguments` is the one JSON spelling a dialect renders and the
fences force, so what the model writes and what comes back in the next turn are the same bytes.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from zllm.canonical import Event, FunctionTool, Message, ToolChoice


class ChatTemplate(Protocol):
    """The model's own chat template over plain messages (`[{"role": ..., "content": str}]`) → prompt text."""

    def __call__(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str: ...


@dataclass(frozen=True)
class Conversation:
    """What `Dialect.render` needs: the canonical conversation and its tools, nothing protocol-specific."""

    messages: tuple[Message, ...]
    tools: tuple[FunctionTool, ...] = ()
    # the request asked the model to reason before answering (only dialects with `supports_thinking` act on it)
    thinking: bool = False
    # False renders a prefix of a conversation (segment naming, count breakdowns): no assistant opener
    add_generation_prompt: bool = True
    # the client's reasoning effort ("low", "high", ...; None: not given), for families whose prompt states it
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class MarkupTokens:
    """Which markup literals the active tokenizer spells as ONE added token, and that token's id.

    llguidance treats added tokens as special: a quoted literal in a grammar matches only ordinary text
    bytes, never the added token. So a grammar must name `<tool_call>` as `<[151657]>` where it is one added
    token (Qwen) and as `"<tool_call>"` where it is plain text (SmolLM2). `lark()` picks the right spelling.
    """

    single: Mapping[str, int] = field(default_factory=dict)

    def lark(self, literal: str) -> str:
        token_id = self.single.get(literal)
        return f"<[{token_id}]>" if token_id is not None else json.dumps(literal, ensure_ascii=False)

    def is_single(self, literal: str) -> bool:
        return literal in self.single


@dataclass(frozen=True)
class FenceSpec:
    """What one request constrains: which tools may be called and how, a JSON Schema for the answer text
    (response_format / text.format json_schema), and whether the output may open with a reasoning block."""

    tools: tuple[FunctionTool, ...] = ()
    choice: ToolChoice = ToolChoice()
    thinking: bool = False
    response_schema: dict | None = None

    @property
    def constrains(self) -> bool:
        """False when the output is free text: nothing to fence (the loop guard still runs)."""
        return self.response_schema is not None or bool(self.tools)


@dataclass(frozen=True)
class FenceGrammar:
    """An llguidance grammar (Lark syntax, `%llguidance {}` header, `%json {...}` sub-schemas) and the literals
    it relies on, which the fence checks against the tokenizer before enabling it."""

    lark: str
    literals: tuple[str, ...] = ()


class StreamParser(ABC):
    """Incremental parser of one generation's text. Not thread-safe; one per request."""

    @abstractmethod
    def feed(self, text: str) -> list[Event]:
        """Consume the next piece of model text; return the events it completes (possibly none). Text that
        might be the start of a tag is held back until it is known not to be."""

    @abstractmethod
    def finish(self) -> list[Event]:
        """The generation ended: flush held text, close an open call (ToolCallEnd with the arguments so far)."""

    @property
    @abstractmethod
    def calls_completed(self) -> int:
        """How many tool calls were closed properly (the finish reason counts opened calls instead: see
        runtime/turn_output.py)."""


class Dialect(ABC):
    """One model family's tool format. Stateless and thread-safe; per-request state lives in parsers."""

    name: ClassVar[str]
    # every tag the parser scans for and the grammar writes, for the fence's tokenizer check and so the
    # detokenizer keeps these tokens even where the tokenizer marks them special
    markup: ClassVar[tuple[str, ...]] = ()
    # markup that MUST be a single added token in the active tokenizer for this dialect to work (DeepSeek V4's
    # `｜DSML｜`); a fence refuses to start otherwise
    single_token_markup: ClassVar[tuple[str, ...]] = ()
    # text that ends the assistant turn besides the model's EOS tokens (GLM's `<|observation|>`)
    end_of_turn: ClassVar[tuple[str, ...]] = ()
    # markup that ends a message but not the turn (harmony's `<|end|>`): never a stop token, even where a
    # template-wide rule would make it one (Phi-3 ends its turns with the same `<|end|>`)
    continues_turn: ClassVar[tuple[str, ...]] = ()
    # of those, markup that ends a turn of text and opens a call too (GigaChat 3's `<|message_sep|>`): it ends the
    # turn where no call can follow (no tools, or tool_choice none), else a model that writes past it runs on into
    # the next role's header
    ends_text_turn: ClassVar[tuple[str, ...]] = ()
    # whether this family can reason in `<think>` blocks, and whether it does when a request does not say
    supports_thinking: ClassVar[bool] = False
    thinking_default: ClassVar[bool] = False
    # False for families that write the whole prompt themselves (DeepSeek DSML, GLM): no Jinja template needed
    needs_chat_template: ClassVar[bool] = True

    def wants_thinking(self, requested: bool | None) -> bool:
        """The request's reasoning switch resolved for this family (None = the family's default)."""
        if not self.supports_thinking:
            return False
        return self.thinking_default if requested is None else requested

    @abstractmethod
    def render(self, conversation: Conversation, template: ChatTemplate | None) -> str:
        """The prompt text (special-token text included, e.g. `<|im_start|>`), ready to encode."""

    @abstractmethod
    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        """A parser for one generation; `thinking` as in the Conversation that was rendered."""

    @abstractmethod
    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        """The grammar for one request, or None when the output is unconstrained (no tools, no schema)."""


def canonical_arguments(arguments: str | dict) -> str:
    """The one JSON spelling of an arguments object that dialects render and fences force:
    `{"key": value, ...}` with ", " and ": " separators, keys in the order given, non-ASCII kept as is.
    Text that is not a JSON object is returned unchanged (a malformed call is echoed as the model wrote it)."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        if not isinstance(parsed, dict):
            return arguments
        arguments = parsed
    return json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "))


# The llguidance JSON options that make the model write exactly `canonical_arguments`' spelling: no optional
# whitespace, the same separators. Put under "x-guidance" in every `%json` schema a dialect emits.
CANONICAL_JSON_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                           # unknown keywords (a client's "format": "weird") are ignored, not a grammar error
                           "lenient": True}
