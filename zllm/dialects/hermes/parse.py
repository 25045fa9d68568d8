"""Incremental parser of Hermes / Qwen output: text, `<think>` reasoning (Qwen3), `<tool_call>` JSON calls.

    <think>\\n{reasoning}\\n</think>\\n\\n         (Qwen3 when thinking: only at the very start of the output)
    {text}\\n<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>\\n<tool_call>\\n...

Framing that is not content (so that rendering the parsed turn gives the output back byte for byte):
- the "\\n" after `<think>`, the "\\n" before `</think>` and up to two "\\n" after it;
- the "\\n" before `<tool_call>` when text or a call precedes it in this output (alone at the start it is text);
- whitespace between a call's closing `}` and `</tool_call>`.

Events: ToolCallStart as soon as the name string is complete; ToolCallArgsDelta with the arguments text as it
arrives (never the object's closing `}`); ToolCallEnd with the whole arguments text as written. Slips tolerated
without being relied on: `<TOOL_CALL>` in upper case, `"parameters"` for `"arguments"`, `"arguments"` given as
a JSON string (its decoded text is the arguments), raw newlines inside strings, a stray `</tool_call>` (dropped),
a missing `</tool_call>` before the next `<tool_call>`.

Malformed calls. Until the name is known, a body that stops being a JSON object prefix is not a call: the
opener and body go out as text, up to and including the next `</tool_call>` (nothing lost). Once the name is
known the call is committed (ToolCallStart went out; to stay split-invariant the parser cannot take it back):
a break inside the arguments keeps the rest of the body, up to `</tool_call>`, as arguments text with the
object's closing `}` dropped; a break elsewhere ends the call there and the rest is text.

Bare JSON calls. Given the declared tools' names, a turn whose content opens with `{` followed by a first member
`"name"` naming one of them is a call written without the tags (small models do this: `{"name": "Bash",
"arguments": {...}}`, Llama 3's `"parameters"`), read like a tagged call's body. Its ToolCallStart waits for the
arguments key, so the call id carries how it was written (`canonical.with_form`) and render.py writes it back
the same way. An object whose first member is not such a name stays text.

End of output (`finish`): held text is flushed; an open call ends with ToolCallEnd carrying the arguments so
far (`{}` when none had started; a JSON-string `arguments` still open is given raw) and is not counted in
`calls_completed`, which counts calls that ended before the output did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto

from zllm.canonical import (
    BARE_JSON_ARGUMENTS,
    BARE_JSON_PARAMETERS,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    with_form,
)
from zllm.dialects.base import StreamParser
from zllm.dialects.hermes.format import CALL_CLOSERS, CALL_OPENERS, THINK_CLOSE, THINK_OPEN
from zllm.dialects.hermes.json_cursor import WHITESPACE, JsonCursor
from zllm.dialects.scan import TagScanner

ARGUMENT_KEYS = ("arguments", "parameters")

# "\n<tool_call>" is a tag of its own so a "\n" that may be framing is held back until the opener decides it
TEXT_TAGS = tuple("\n" + tag for tag in CALL_OPENERS) + CALL_OPENERS + CALL_CLOSERS
REASONING_TAGS = ("\n" + THINK_CLOSE, THINK_CLOSE)
# what follows a value that broke inside `arguments`: the object's own closing brace and framing whitespace
_OUTER_CLOSE = re.compile(r"(\s*\})?\s*\Z")


class _State(Enum):
    """Where the parser is in the output; each state has one handler, `_in_<state>`, which reads a piece of
    text and returns what it left unread (read again in the state it moved to)."""

    START = auto()  # thinking: the output may still open with <think>
    REASONING = auto()  # inside <think>, until </think>
    AFTER_THINK = auto()  # the up to two "\n" after </think>
    TEXT = auto()
    CALL = auto()  # after <tool_call>: the JSON body, one character at a time
    RAW = auto()  # a malformed call: text up to and including its closer
    BROKEN_ARGS = auto()  # the arguments stopped being JSON: raw arguments up to the closer


@dataclass
class _OpenCall:
    opener: str  # the opener as written, with its "\n" when that was framing: a malformed call gives it back
    cursor: JsonCursor = field(default_factory=JsonCursor)
    body: str = ""  # the text after the opener, kept until the call is committed
    index: int = -1
    name: str | None = None  # set when committed
    key: str | None = None  # the member key last read
    member: str | None = None  # "name" / "arguments" / "other" while a member value is read
    name_raw: str = ""
    args_raw: str | None = None  # the arguments value as written; None: not started
    args_is_string: bool = False
    args_closed: bool = False
    args_decoded: str = ""  # a JSON-string `arguments`, decoded
    broken_at: int | None = None  # where in args_raw the JSON broke (after commit)
    sent: int = 0  # how much of the arguments went out as ToolCallArgsDelta
    bare: bool = False  # a bare JSON call opening the turn: no tags around it
    start_pending: bool = False  # bare: the name is known, ToolCallStart waits for the arguments key

    def streamable(self) -> str:
        """The arguments text that can go out now."""
        if self.args_raw is None:
            return ""
        if self.args_is_string:
            return self.args_decoded if self.args_closed else ""
        return self._trimmed()

    def final(self) -> str:
        """The arguments text when the call ends now."""
        if self.args_raw is None:
            return "{}"
        if self.args_is_string and not self.args_closed:
            return self._trimmed()
        return self.streamable()

    def _trimmed(self) -> str:
        if self.broken_at is None:
            return self.args_raw
        tail = self.args_raw[self.broken_at:]
        return self.args_raw[:self.broken_at] + tail[:_OUTER_CLOSE.search(tail).start()]


class HermesParser(StreamParser):
    def __init__(self, *, thinking: bool, new_call_id: Callable[[], str], bare_tools: frozenset[str] = frozenset()):
        """`bare_tools`: the declared tools' names, which a bare JSON object opening the turn may call."""
        self._new_call_id = new_call_id
        self._bare_tools = bare_tools
        self._content_begun = False  # the first character of content (after any reasoning) was read
        self._state = _State.START if thinking else _State.TEXT
        self._handlers: dict[_State, Callable[[str], str]] = {
            _State.START: self._in_start, _State.REASONING: self._in_reasoning,
            _State.AFTER_THINK: self._in_after_think, _State.TEXT: self._in_text, _State.CALL: self._in_call,
            _State.RAW: self._in_raw, _State.BROKEN_ARGS: self._in_broken_args,
        }
        self._scanner = TagScanner(TEXT_TAGS)  # one scanner; its tags follow the state, held text is empty then
        self._events: list[Event] = []
        self._start = ""  # output so far while it might still open with <think>
        self._reasoning_fresh = True  # the "\n" right after <think> is framing
        self._newlines_after_think = 0
        self._drop_leading_ws = False  # between a call's JSON and </tool_call>
        self._wrote_anything = False  # text or a call so far: a "\n" before <tool_call> is then framing
        self._call: _OpenCall | None = None
        self._started = 0
        self._completed = 0

    @property
    def calls_completed(self) -> int:
        return self._completed

    def feed(self, text: str) -> list[Event]:
        while text:
            text = self._handlers[self._state](text)
        self._flush_arguments()
        return self._take_events()

    def finish(self) -> list[Event]:
        held = self._start + "".join(piece.text for piece in self._scanner.flush())
        self._start = ""
        if self._state in (_State.START, _State.TEXT, _State.RAW):
            self._text(held)
        elif self._state is _State.REASONING:
            self._reasoning(held)
        elif self._state is _State.BROKEN_ARGS:
            self._call.args_raw += held
            self._end_call(counted=False)
        elif self._state is _State.CALL:
            if self._call.name is None:
                self._text(self._call.opener + self._call.body)
                self._call = None
            else:
                self._end_call(counted=False)
        self._state = _State.TEXT
        return self._take_events()

    # ---------------------------------------------------------------------------------- states

    def _in_start(self, text: str) -> str:
        self._start += text
        if THINK_OPEN.startswith(self._start) and self._start != THINK_OPEN:
            return ""  # might still become <think>
        start, self._start = self._start, ""
        if start.startswith(THINK_OPEN):
            self._state = _State.REASONING
            return start[len(THINK_OPEN):]
        self._state = _State.TEXT
        return start

    def _in_reasoning(self, text: str) -> str:
        before, tag, rest = self._scan(REASONING_TAGS, text)
        self._reasoning(before)
        if tag is not None:
            self._state = _State.AFTER_THINK
        return rest

    def _in_after_think(self, text: str) -> str:
        at = 0
        while at < len(text) and text[at] == "\n" and self._newlines_after_think < 2:
            at += 1
            self._newlines_after_think += 1
        if at < len(text) or self._newlines_after_think == 2:
            self._state = _State.TEXT
        return text[at:]

    def _in_text(self, text: str) -> str:
        if not self._content_begun:
            self._content_begun = True
            if self._bare_tools and text.startswith("{"):
                self._call, self._state = _OpenCall(opener="", bare=True), _State.CALL
                return text
        before, tag, rest = self._scan(TEXT_TAGS, text)
        self._text(before)
        if tag is None:
            return rest
        self._drop_leading_ws = False
        if tag in CALL_CLOSERS:
            return rest  # a stray closer
        if tag.startswith("\n") and not self._wrote_anything:
            self._text("\n")  # nothing before it: not a separator
            tag = tag[1:]
        self._call = _OpenCall(opener=tag)
        self._state = _State.CALL
        return rest

    def _in_call(self, text: str) -> str:
        call = self._call
        for at, ch in enumerate(text):
            cursor = call.cursor
            cursor.step(ch)
            if cursor.member_ended_before:  # a number or literal ended before `ch`, valid or not
                self._end_member()
            if cursor.error:
                return self._call_broke(text[at:])
            if cursor.member_started and not self._start_member(ch):
                return self._call_broke(text[at:])
            self._read_body_char(ch)
            if cursor.member_ended_with:
                self._end_member()
                if call.bare and call.name is None:  # named no declared tool: text after all
                    return self._malformed(text[at + 1:])
            if cursor.key is not None:
                call.key = cursor.key
            if cursor.done:
                return self._call_closed(text[at + 1:])
        return ""

    def _in_raw(self, text: str) -> str:
        """A malformed call: text, up to and including its closer."""
        before, tag, rest = self._scan(CALL_CLOSERS, text)
        self._text(before + (tag or ""))
        if tag is not None:
            self._state = _State.TEXT
        return rest

    def _in_broken_args(self, text: str) -> str:
        before, tag, rest = self._scan(CALL_CLOSERS, text)
        self._call.args_raw += before
        if tag is not None:
            self._end_call(counted=True)
            self._state = _State.TEXT
        return rest

    # ---------------------------------------------------------------------------------- calls

    def _start_member(self, ch: str) -> bool:
        """A member value starts with `ch`; False when that makes the body no call."""
        call = self._call
        if call.key == "name" and call.name is None:
            call.member, call.name_raw = "name", ""
            return ch == '"'  # only a string names a tool
        if call.bare and call.name is None:
            return False  # a bare call opens with its name
        if call.key in ARGUMENT_KEYS and call.args_raw is None:
            call.member, call.args_raw, call.args_is_string = "arguments", "", ch == '"'
            self._start_pending(call.key)
        else:
            call.member = "other"
        return True

    def _read_body_char(self, ch: str) -> None:
        call = self._call
        if call.name is None:
            call.body += ch
        if call.member == "name":
            call.name_raw += ch
        elif call.member == "arguments":
            call.args_raw += ch

    def _end_member(self) -> None:
        call = self._call
        if call.member == "name":
            name = json.loads(call.name_raw, strict=False)
            if call.bare and name not in self._bare_tools:
                call.member = None
                return
            call.name = name
            call.index = self._started
            self._started += 1
            self._wrote_anything = True
            if call.bare:
                call.start_pending = True
            else:
                self._events.append(ToolCallStart(call.index, self._new_call_id(), call.name))
        elif call.member == "arguments":
            call.args_closed = True
            if call.args_is_string:
                call.args_decoded = json.loads(call.args_raw, strict=False)
        call.member = None

    def _call_closed(self, rest: str) -> str:
        if self._call.name is None:  # a JSON object, but no tool name in it
            return self._malformed(rest)
        self._end_call(counted=True)
        self._state, self._drop_leading_ws = _State.TEXT, True
        return rest

    def _call_broke(self, rest: str) -> str:
        """The body stopped being JSON at the first character of `rest`."""
        call = self._call
        if call.name is None:
            return self._malformed(rest)
        if call.member == "arguments":
            call.broken_at = len(call.args_raw)
            self._state = _State.BROKEN_ARGS
            return rest
        self._end_call(counted=True)
        self._state = _State.TEXT
        return rest

    def _start_pending(self, key: str | None) -> None:
        """A bare call's ToolCallStart, once how it spells its arguments key is known."""
        call = self._call
        if call.start_pending:
            call.start_pending = False
            form = BARE_JSON_PARAMETERS if key == "parameters" else BARE_JSON_ARGUMENTS
            self._events.append(ToolCallStart(call.index, with_form(self._new_call_id(), form), call.name))

    def _malformed(self, rest: str) -> str:
        self._text(self._call.opener + self._call.body)
        # a tagged call's text runs to its closer; a bare object that is no call is just the answer's text
        self._state = _State.TEXT if self._call.bare else _State.RAW
        self._call = None
        return rest

    def _end_call(self, *, counted: bool) -> None:
        call = self._call
        self._start_pending(None)
        self._flush_arguments()
        arguments = call.final()
        if len(arguments) > call.sent:
            self._events.append(ToolCallArgsDelta(call.index, arguments[call.sent:]))
        self._events.append(ToolCallEnd(call.index, arguments))
        self._completed += counted
        self._call = None

    def _flush_arguments(self) -> None:
        call = self._call
        if call is None or call.name is None:
            return
        streamable = call.streamable()
        if len(streamable) > call.sent:
            self._events.append(ToolCallArgsDelta(call.index, streamable[call.sent:]))
            call.sent = len(streamable)

    # -------------------------------------------------------------------------------- helpers

    def _scan(self, tags: tuple[str, ...], text: str) -> tuple[str, str | None, str]:
        """Text up to the first tag, that tag (None: no tag yet, a possible partial tag held back), and the
        unscanned rest after it."""
        self._scanner.tags = tags
        pieces = self._scanner.feed(text)
        if not pieces:
            return "", None, ""
        first = pieces[0]
        if first.tag is None:
            return first.text, None, ""
        rest = "".join(piece.text + (piece.tag or "") for piece in pieces[1:])
        return first.text, first.tag, rest + "".join(piece.text for piece in self._scanner.flush())

    def _text(self, text: str) -> None:
        if self._drop_leading_ws:
            text = text.lstrip(WHITESPACE)
            self._drop_leading_ws = not text
        if text:
            self._events.append(TextDelta(text))
            self._wrote_anything = True

    def _reasoning(self, text: str) -> None:
        if self._reasoning_fresh and text:
            self._reasoning_fresh = False
            text = text.removeprefix("\n")
        if text:
            self._events.append(ReasoningDelta(text))

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events
