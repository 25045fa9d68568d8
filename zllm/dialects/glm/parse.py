"""GLM-4.5 output parsing: text, `<think>` reasoning and `<tool_call>` blocks, incrementally (see dialect.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto

from zllm.canonical import (
    Event,
    FunctionTool,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.bare_json import BareCallReader
from zllm.dialects.base import (
    StreamParser,
)
from zllm.dialects.glm.format import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    SLIPS,
    SPELLINGS,
    THINK_CLOSE,
    THINK_OPEN,
    VALUE_CLOSE,
    VALUE_OPEN,
    param_schemas,
    spellings,
    string_param,
    value_json,
)
from zllm.dialects.scan import TagScanner

_NAME_LIMIT = 128  # a "name line" longer than this is prose that happened to follow a <tool_call>


class _State(Enum):
    """Where the parser is in the markup; each state has one handler, `_in_<state>`, and its own tags."""

    TEXT = auto()
    REASONING = auto()
    NAME = auto()  # after <tool_call>, until the name line ends
    BETWEEN = auto()  # inside a call, expecting <arg_key> or </tool_call>
    KEY = auto()  # after <arg_key>
    AFTER_KEY = auto()  # after </arg_key>, expecting <arg_value>
    VALUE = auto()  # after <arg_value>
    BARE = auto()  # the content opened with `{`: a bare JSON call, or text (bare_json.py)


_TAGS: dict[_State, tuple[str, ...]] = {
    _State.TEXT: spellings(THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE),
    _State.REASONING: spellings(THINK_CLOSE),
    _State.NAME: SPELLINGS + ("\n",),
    _State.BETWEEN: SPELLINGS,
    _State.KEY: SPELLINGS,
    _State.AFTER_KEY: SPELLINGS,
    _State.VALUE: spellings(VALUE_CLOSE, CALL_CLOSE),
}


@dataclass
class _Call:
    """The call being parsed: its JSON arguments so far and the pair in progress."""

    index: int
    tool: FunctionTool | None
    arguments: str = ""
    key: str = ""
    raw: str = ""  # the in-progress pair as written, given back as text if the pair turns out malformed
    value: list[str] = field(default_factory=list)
    streaming: bool = False  # a string value: its JSON text is streamed as it comes

    def string_param(self, key: str) -> bool:
        return string_param(self.tool, param_schemas(self.tool), key)


class GlmXmlParser(StreamParser):
    """Text → events, one state per position in the markup. Each piece of text the scanner yields is handled
    in the current state; a handler may give text back (malformed markup turned into text), which is then
    scanned again in the new state, so the events depend only on the whole text, never on how it was cut."""

    def __init__(self, tools: tuple[FunctionTool, ...], new_call_id: Callable[[], str]):
        self._tools = {tool.name: tool for tool in tools}
        self._new_call_id = new_call_id
        self._state = _State.TEXT
        self._handlers: dict[_State, Callable[[str, str | None, str | None], str]] = {
            _State.TEXT: self._in_text, _State.REASONING: self._in_reasoning, _State.NAME: self._in_name,
            _State.BETWEEN: self._in_between, _State.KEY: self._in_key, _State.AFTER_KEY: self._in_after_key,
            _State.VALUE: self._in_value, _State.BARE: self._in_bare,
        }
        self._scanner = TagScanner(_TAGS[_State.TEXT])
        self._events: list[Event] = []
        self._skip_newline = True  # the separator GLM writes after `<|assistant|>` and after `</think>`
        self._held_newline = ""  # a trailing "\n" of text: GLM's separator if a call follows, else text
        self._call_prefix = ""  # that newline, kept while the name line may still prove not to be a call
        self._name = ""
        self._call: _Call | None = None
        self._calls_started = 0
        self._calls_completed = 0
        self._bare_tools = frozenset(self._tools)  # a bare JSON call may open the content (bare_json.py)
        self._bare: BareCallReader | None = None
        self._content_begun = False  # text or a call went out (reasoning does not count)

    @property
    def calls_completed(self) -> int:
        return self._calls_completed

    def feed(self, text: str) -> list[Event]:
        self._run(text)
        return self._take()

    def finish(self) -> list[Event]:
        if self._state is _State.BARE:
            self._events += self._bare.finish()
            self._end_bare()
        self._run(self._flush_held())  # held text, rescanned under the current state's tags
        leftover = self._flush_held()
        if self._state is _State.TEXT:
            self._text(leftover)
        elif self._state is _State.REASONING:
            self._reasoning(leftover)
        elif self._state is _State.NAME:
            self._text(self._call_prefix + CALL_OPEN + self._name + leftover)
        elif self._state is _State.VALUE:
            self._value_text(leftover)
            self._end_pair()
        if self._call is not None:
            self._end_call(completed=False)
        self._text_flush()
        return self._take()

    # -- the loop

    def _run(self, text: str) -> None:
        pending = text
        while pending:
            if self._state is _State.TEXT and self._may_open_bare():
                if self._skip_newline and pending.startswith("\n"):  # GLM's separator before the content
                    self._skip_newline, pending = False, pending[1:]
                    continue
                if pending.startswith("{"):
                    self._bare, self._state = BareCallReader(self._bare_tools, self._new_call_id), _State.BARE
            if self._state is _State.BARE:  # not scanned for tags: the bare reader reads JSON
                pending = self._handlers[_State.BARE](pending, None, None)
                continue
            pieces = self._scanner.feed(pending)
            if not pieces:
                return
            first, rest = pieces[0], "".join(p.text + (p.tag or "") for p in pieces[1:])
            given_back = self._handle(first.text, first.tag)
            if first.tag is None and not given_back:
                return  # all text consumed; the scanner holds a possible partial tag
            # the tag may have changed the state: what follows it is scanned again with the new tags
            pending = given_back + rest + self._flush_held()

    def _may_open_bare(self) -> bool:
        """The next character would open the content: no text, call or held text yet."""
        return (bool(self._bare_tools) and not self._content_begun and not self._scanner.held
                and not self._held_newline)

    def _in_bare(self, text: str, tag: str | None, canonical: str | None) -> str:
        """The content's opening object, read by the bare reader; once it ended, what followed is read here."""
        self._events += self._bare.feed(text)
        if not self._bare.done:
            return ""
        rest = self._bare.take_rest()
        self._end_bare()
        return rest

    def _end_bare(self) -> None:
        bare, self._bare = self._bare, None
        self._calls_completed += bare.calls_completed
        self._calls_started += bare.calls_started  # GLM's own calls are numbered after a bare one
        self._content_begun, self._skip_newline = True, False
        self._go(_State.TEXT)

    def _flush_held(self) -> str:
        return "".join(piece.text for piece in self._scanner.flush())

    def _handle(self, text: str, tag: str | None) -> str:
        canonical = SLIPS.get(tag, tag) if tag is not None else None
        return self._handlers[self._state](text, tag, canonical)

    def _go(self, state: _State) -> None:
        self._state = state
        self._scanner.tags = _TAGS[state]

    # -- state handlers: (text before the tag, the tag as written, its canonical form) → text given back

    def _in_text(self, text: str, tag: str | None, canonical: str | None) -> str:
        self._text(text)
        if canonical == THINK_OPEN:
            self._text_flush()
            self._skip_newline = False
            self._go(_State.REASONING)
        elif canonical == CALL_OPEN:
            self._call_prefix, self._held_newline, self._skip_newline = self._held_newline, "", False
            self._name = ""
            self._go(_State.NAME)
        # a stray `</think>` or `</tool_call>` is markup, not content: dropped
        return ""

    def _in_reasoning(self, text: str, tag: str | None, canonical: str | None) -> str:
        self._reasoning(text)
        if canonical == THINK_CLOSE:
            self._skip_newline = True
            self._go(_State.TEXT)
        return ""

    def _in_name(self, text: str, tag: str | None, canonical: str | None) -> str:
        self._name += text
        name = self._name.strip()
        too_long = len(self._name) > _NAME_LIMIT
        if tag is None and not too_long:
            return ""
        prefix, self._call_prefix = self._call_prefix, ""
        if too_long or canonical not in ("\n", KEY_OPEN, CALL_CLOSE) or not name or any(c.isspace() for c in name):
            self._text(prefix + CALL_OPEN + self._name)
            self._go(_State.TEXT)
            return tag or ""
        self._start_call(name)
        if canonical == CALL_CLOSE:
            self._end_call(completed=True)
        elif canonical == KEY_OPEN:
            self._begin_pair(tag)
        else:
            self._go(_State.BETWEEN)
        return ""

    def _in_between(self, text: str, tag: str | None, canonical: str | None) -> str:
        if text.strip():
            self._end_call(completed=False)
            return text.lstrip() + (tag or "")
        if canonical == KEY_OPEN:
            self._begin_pair(tag)
        elif canonical == CALL_CLOSE:
            self._end_call(completed=True)
        elif tag is not None:
            self._end_call(completed=False)
            return tag
        return ""

    def _in_key(self, text: str, tag: str | None, canonical: str | None) -> str:
        call = self._open_call()
        call.key += text
        call.raw += text + (tag or "")
        if canonical == KEY_CLOSE and call.key.strip():
            call.key = call.key.strip()
            self._go(_State.AFTER_KEY)
        elif canonical == CALL_CLOSE:
            self._end_call(completed=True)  # a dangling key is dropped
        elif tag is not None:
            return self._malformed_pair()
        return ""

    def _in_after_key(self, text: str, tag: str | None, canonical: str | None) -> str:
        call = self._open_call()
        call.raw += text + (tag or "")
        if text.strip():
            return self._malformed_pair()
        if canonical == VALUE_OPEN:
            call.streaming = call.string_param(call.key)
            if call.streaming:
                self._args(self._pair_head(call) + '"')
            self._go(_State.VALUE)
        elif canonical == CALL_CLOSE:
            self._end_call(completed=True)
        elif tag is not None:
            return self._malformed_pair()
        return ""

    def _in_value(self, text: str, tag: str | None, canonical: str | None) -> str:
        self._value_text(text)
        if canonical is not None:
            self._end_pair()
            if canonical == CALL_CLOSE:  # a slip: the value's closer was left out
                self._end_call(completed=True)
            else:
                self._go(_State.BETWEEN)
        return ""

    # -- calls

    def _open_call(self) -> _Call:
        assert self._call is not None, "inside a call"
        return self._call

    def _start_call(self, name: str) -> None:
        self._content_begun = True
        self._call = _Call(self._calls_started, self._tools.get(name))
        self._calls_started += 1
        self._events.append(ToolCallStart(self._call.index, self._new_call_id(), name))

    def _begin_pair(self, tag: str | None) -> None:
        call = self._open_call()
        call.key, call.raw, call.value, call.streaming = "", tag or KEY_OPEN, [], False
        self._go(_State.KEY)

    def _pair_head(self, call: _Call) -> str:
        return ("{" if not call.arguments else ", ") + json.dumps(call.key, ensure_ascii=False) + ": "

    def _value_text(self, text: str) -> None:
        call = self._open_call()
        if call.streaming:
            if text:
                self._args(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            call.value.append(text)

    def _end_pair(self) -> None:
        call = self._open_call()
        if call.streaming:
            self._args('"')
        else:
            self._args(self._pair_head(call) + value_json("".join(call.value)))
        call.key, call.raw, call.value, call.streaming = "", "", [], False

    def _malformed_pair(self) -> str:
        """The pair in progress is not GLM markup: the call ends with the pairs before it, the pair is text."""
        raw = self._open_call().raw
        self._end_call(completed=False)
        return raw

    def _end_call(self, *, completed: bool) -> None:
        call = self._open_call()
        self._args("}" if call.arguments else "{}")
        self._events.append(ToolCallEnd(call.index, call.arguments))
        self._calls_completed += completed
        self._call = None
        self._skip_newline = True
        self._go(_State.TEXT)

    def _args(self, text: str) -> None:
        call = self._open_call()
        call.arguments += text
        self._events.append(ToolCallArgsDelta(call.index, text))

    # -- text and reasoning

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._skip_newline:
            self._skip_newline = False
            text = text.removeprefix("\n")
        text, self._held_newline = self._held_newline + text, ""
        if text.endswith("\n"):
            text, self._held_newline = text[:-1], "\n"
        if text:
            self._events.append(TextDelta(text))
            self._content_begun = True

    def _text_flush(self) -> None:
        if self._held_newline:
            self._events.append(TextDelta(self._held_newline))
            self._held_newline = ""
            self._content_begun = True

    def _reasoning(self, text: str) -> None:
        if text:
            self._events.append(ReasoningDelta(text))

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events
