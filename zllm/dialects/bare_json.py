"""Bare JSON calls for families whose own calls are markup (derived formats, GLM): small models slip and
write a call as a bare JSON object opening the turn, `{"name": "Bash", "arguments": {...}}` (or Llama 3's
`"parameters"`), without the family's markers. Hermes reads that in its own parser (hermes/parse.py); the other
families hand the opening of their content to a `BareCallReader`, which reads it the same way:

- only an object whose FIRST member is `"name"` naming a DECLARED tool is a call; any other JSON (an answer, a
  structured reply) stays text, byte for byte;
- the call's id carries how it was written (`canonical.with_form`: "-bja" / "-bjp"), so the next turn's prompt
  writes it back bare, as the model wrote it (`bare_call_text`): the prompt keeps continuing the cache;
- after the object, whitespace is framing (dropped, as Hermes does) and the rest goes back to the family's own
  parser (`rest`), its calls numbered after the bare one.

A family whose own calls already open with `{` (Llama 3.x) reads them with its own format: no bare reader there.

The fence side (`bare_call_rules`, `bare_opening_regex`): under `auto` the answer may be one bare call from its
opening brace and nothing after it, and free text may not open the way such a call does.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from zllm.canonical import BARE_JSON_PARAMETERS, CALL_FORMS, FunctionTool, Message, ToolCall
from zllm.dialects.base import canonical_arguments
from zllm.dialects.hermes.json_cursor import WHITESPACE
from zllm.dialects.hermes.parse import HermesParser, _State


class BareCallReader(HermesParser):
    """Reads the opening `{...}` of a turn's content: a bare call, or (naming no declared tool) text. Fed from
    the opening brace; `done` once the object ended or stopped being a call, with what followed in `rest`."""

    def __init__(self, tools: frozenset[str], new_call_id: Callable[[], str]):
        super().__init__(thinking=False, new_call_id=new_call_id, bare_tools=tools)
        self._rest: list[str] = []

    @property
    def done(self) -> bool:
        """The object ended; after a call, whitespace is framing, so only once something else followed it."""
        if not (self._content_begun and self._state is _State.TEXT):
            return False
        return not self._started or bool("".join(self._rest).lstrip(WHITESPACE))

    @property
    def calls_started(self) -> int:
        return self._started

    def take_rest(self) -> str:
        """What followed the object (a call's trailing whitespace dropped); call once `done`."""
        rest, self._rest = "".join(self._rest), []
        return rest.lstrip(WHITESPACE) if self._started else rest

    def _in_text(self, text: str) -> str:
        if not self._content_begun:
            return super()._in_text(text)  # the opening brace: reads the object
        self._rest.append(text)  # after the object: the family's own parser reads it
        return ""


def reads_bare(call_opener: str) -> bool:
    """Whether a family whose call opens with `call_opener` reads bare JSON calls: not when its own calls
    already are bare JSON (the family's format is then the only reading)."""
    return not call_opener.lstrip(WHITESPACE).startswith("{")


def opens_bare(message: Message) -> ToolCall | None:
    """The call an assistant turn opens with, written bare by the model (None: none was)."""
    if message.role == "assistant" and not message.content and message.tool_calls:
        first = message.tool_calls[0]
        return first if first.form in CALL_FORMS else None
    return None


def bare_call_text(call: ToolCall) -> str:
    """The call's JSON object as the model wrote it: its arguments key as `call.form` says."""
    key = "parameters" if call.form == BARE_JSON_PARAMETERS else "arguments"
    name = json.dumps(call.name, ensure_ascii=False)
    return f'{{"name": {name}, "{key}": {canonical_arguments(call.arguments)}}}'


def bare_call_rules(tools: tuple[FunctionTool, ...], framing: str = "") -> dict[str, str]:
    """Lark rules by name: `bare_call`, one declared call as a bare JSON object after `framing` (GLM's "\\n"),
    framing and head one literal (llguidance lexes greedily: free text must not be able to take the "\\n")."""
    from zllm.dialects.hermes.grammar import arguments_schema, guided, lark_string

    rules = {"bare_call": " | ".join(f"bare_{i}" for i in range(len(tools))),
             "bare_key": '"arguments" | "parameters"'}
    for i, tool in enumerate(tools):
        head = lark_string(framing + '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "')
        rules[f"bare_{i}"] = f'{head} bare_key "\\": " %json {guided(arguments_schema(tool))} "}}"'
    return rules


def bare_opening_regex(tools: tuple[FunctionTool, ...], framing: str = "") -> str:
    """A Lark regex for text that opens as a bare call of one of `tools` does, after `framing` (a regex) —
    which free text must not: the parser would read it as a call."""
    from zllm.dialects.hermes.grammar import _regex_literal

    ws = "[ \\t\\n\\r]*"
    names = "|".join(_regex_literal(json.dumps(tool.name, ensure_ascii=False)) for tool in tools)
    return f'/{framing}\\{{{ws}"name"{ws}:{ws}({names})(?s:.*)/'
