"""A dialect derived from the model's chat template (`derived`): the template renders, a format found by probing
it (probe.py) parses and fences. Built per model by `derive_dialect` (the registry calls it):

    result = derive_dialect(template_source, added_tokens=..., bos_token=..., eos_token=...)
    result.dialect    # a Dialect, or None
    result.derived    # True when the template's calls were described
    result.reason     # why (or why not), in words: "Qwen3-Coder-style per-parameter tags: <tool_call>..."
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

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
from zllm.dialects.derived.format import CallFormat
from zllm.dialects.derived.grammar import fence_grammar
from zllm.dialects.derived.jinja import JinjaChatTemplate
from zllm.dialects.derived.parse import DerivedParser
from zllm.dialects.derived.probe import (
    NotDerivable,
    derive_format,
    split_markers,
    thinking_switch,
    thinking_variable,
)
from zllm.dialects.derived.render import render_conversation


class DerivedDialect(Dialect):
    name = "derived"
    needs_chat_template = False  # it carries its own (the source it was derived from)
    renders_its_template = True  # ... and writes every call through it (template_match.py need not compare)

    def __init__(self, fmt: CallFormat, template: JinjaChatTemplate, markers: Iterable[str] = (), *,
                 switched: dict[bool, CallFormat] | None = None, thinking_default: bool = False,
                 switch_variable: str = "enable_thinking", switch_words: dict[bool, str] | None = None):
        """`switched`: for a template that reads `enable_thinking`, the format under each setting (its generation
        prompt opens or closes the reasoning block); `thinking_default` the setting it uses when not given;
        `switch_words`: the value given for each setting where the template reads words, not a boolean."""
        self.format = fmt  # under the template's defaults
        self.switch_variable = switch_variable  # the template variable `switched` is read from
        self.switch_words = dict(switch_words or {})
        self.switched = dict(switched or {})
        self.template = template
        formats = (fmt, *self.switched.values())
        # each literal cut at its special markers: the fence names an added token by id, text by its bytes
        self.markup = tuple(dict.fromkeys(piece for f in formats for literal in f.literals()
                                          for piece in split_markers(literal, tuple(markers)) if piece))
        # a turn end that opens the calls too (GigaChat 3's `<|message_sep|>`) never stops generation: the model's
        # EOS ends such a turn
        self.continues_turn = tuple(dict.fromkeys(f.turn_end for f in formats if f.end_opens_calls))
        self.ends_text_turn = self.continues_turn  # ... and stops it where no call can follow (runtime/client_base.py)
        # the turn's end, and the marker alone where whitespace precedes it (Reka Edge's `\n\n<sep>`): generation
        # stops at the marker's token (the parser drops the whitespace before it)
        self.end_of_turn = tuple(dict.fromkeys(end for f in formats for end in (f.turn_end, f.call_turn_end,
                                                                                _marker_after_space(f.turn_end))
                                               if end and end not in self.continues_turn))
        # what the template writes after the last message (round_trip.py: the next prompt moves it)
        self.after_last_message = fmt.after_last
        self.supports_thinking = bool(self.switched) or fmt.reasons
        self.thinking_default = thinking_default if self.switched else fmt.reasons

    @property
    def single_call(self) -> bool:
        """The template writes one call per turn (the round-trip check probes one)."""
        return self.format.single_call

    def format_for(self, thinking: bool) -> CallFormat:
        return self.switched.get(thinking, self.format)

    def render(self, conversation: Conversation, template: ChatTemplate | None = None) -> str:
        setting = conversation.thinking
        variables = {self.switch_variable: self.switch_words.get(setting, setting)} if self.switched else {}
        return render_conversation(self.template, conversation, self.format_for(conversation.thinking), **variables)

    def parser(self, tools: tuple[FunctionTool, ...], *, thinking: bool,
               new_call_id: Callable[[], str]) -> StreamParser:
        return DerivedParser(self.format_for(thinking), tools, new_call_id, thinking=thinking)

    def fence_grammar(self, spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
        return fence_grammar(spec, markup, fmt=self.format_for(spec.thinking), pieces=self.markup)


# reasoning switches a template reads as words, not a boolean, and the word for each setting of the client's.
# MiniMax M3's `thinking_mode`: reasoning on is its default, "adaptive" (the model decides; "enabled" would force
# it, but a request's switch cannot tell "on" from "not said", and the default must stay the template's), off is
# "disabled" (the prompt closes the block: the model answers at once)
WORD_SWITCHES = {"thinking_mode": {True: "adaptive", False: "disabled"}}


def _word_switch(template: JinjaChatTemplate) -> tuple[str, dict[bool, str]] | None:
    """(variable, word per setting) of a word switch the template's generation prompt follows; None if none does."""
    for variable, words in WORD_SWITCHES.items():
        if not re.search(rf"\b{variable}\b", template.source):
            continue
        try:
            on, off = (template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                **{variable: words[setting]}) for setting in (True, False))
        except Exception:  # noqa: BLE001 - a template that refuses the probe: no switch
            continue
        if on != off:
            return variable, words
    return None


def _eos_ends_turn(fmt: CallFormat, eos_token: str) -> CallFormat:
    """A template that writes the EOS right after its calls and none after the last turn's text (Hy3's
    `</tool_calls:opensource><｜hy_eos:opensource｜>`): generation stops at that token, so the model's output never
    holds it: it ends the turn (`call_turn_end`), it does not close the calls."""
    if fmt.turn_end or not eos_token or fmt.section_close == eos_token or not fmt.section_close.endswith(eos_token):
        return fmt
    return replace(fmt, section_close=fmt.section_close[:-len(eos_token)], call_turn_end=fmt.call_turn_end or eos_token)


def _marker_after_space(turn_end: str) -> str:
    """`<sep>` of `\n\n<sep>`: the marker that ends a turn end made of whitespace and one marker; "" otherwise."""
    pieces = split_markers(turn_end)
    return pieces[1] if len(pieces) == 2 and pieces[0].isspace() else ""


@dataclass(frozen=True)
class Derivation:
    dialect: DerivedDialect | None
    derived: bool
    reason: str


def derive_dialect(template_source: str, *, added_tokens: Iterable[str] = (), bos_token: str = "",
                   eos_token: str = "") -> Derivation:
    """The entry point: a template (and the vocabulary's added tokens, to cut literals at real markers) →
    a dialect with its format, or None and the reason it could not be derived."""
    markers = tuple(added_tokens)
    try:
        template = JinjaChatTemplate(template_source, bos_token=bos_token, eos_token=eos_token)
        fmt, failure = derive_format(template, markers), None
    except NotDerivable as exc:
        fmt, failure = None, exc
    except Exception as exc:  # a template Jinja cannot compile
        return Derivation(None, False, f"the template cannot be rendered: {type(exc).__name__}: {exc}")
    variable, words = thinking_variable(template), {}
    default, switched = (thinking_switch(template, variable) if variable else None), {}
    if not variable and (found := _word_switch(template)):
        (variable, words), default = found, True  # on: the template's default
    if default is not None:
        for setting in (True, False):
            try:
                switched[setting] = derive_format(template, markers, **{variable: words.get(setting, setting)})
            except NotDerivable:
                pass
    spelled = f": {words[True]!r} / {words[False]!r}" if words else ""
    how = (f"; `{variable}` follows the client's reasoning switch{spelled} (default "
           f"{'on' if default else 'off'})") if len(switched) == 2 and fmt is not None else ""
    if fmt is None and len(switched) == 1:
        # the template's default prompt is not continued by the turns it renders (Gemma 4 opens and closes an
        # empty thought channel in the prompt, never in the turn): served with the setting that is
        (default, fmt), = switched.items()
        how = (f"; `{variable}` {'on' if default else 'off'} by default (turns rendered with it "
               f"{'off' if default else 'on'} do not continue the prompt: the cache forks there)")
    elif fmt is None:
        return Derivation(None, False, str(failure))
    elif len(switched) != 2:
        switched = {}  # one setting cannot be described: the template's default only
    fmt, switched = _eos_ends_turn(fmt, eos_token), {k: _eos_ends_turn(f, eos_token) for k, f in switched.items()}
    return Derivation(DerivedDialect(fmt, template, markers, switched=switched, thinking_default=bool(default),
                                     switch_variable=variable or "enable_thinking", switch_words=words), True,
                      f"derived from the chat template: {fmt.arguments} arguments, a call reads {fmt.summary()!r}"
                      + how)
