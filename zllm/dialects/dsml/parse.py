"""Incremental parser of DeepSeek DSML output (V3.2 and V4) into canonical events.

With thinking on, the prompt ends with `<think>`, so the output starts inside the reasoning:

    REASONING</think>CONTENT\\n\\n<｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">Paris</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

→ ReasoningDelta("REASONING"), TextDelta("CONTENT"), ToolCallStart(0, id, "get_weather"),
  ToolCallArgsDelta(0, '{"location": "Paris"'), ToolCallArgsDelta(0, "}"), ToolCallEnd(0, '{"location": "Paris"}')

The blank line before the block is the block's separator, not content (the renderer writes it back).
Tolerated slips: `|DSML|` with ASCII bars, either block name, a re-emitted `<think>` at the start, a stray
`</think>` or DSML closer in content, a block opener inside the reasoning (ends it), a missing parameter or
invoke closer. A block that goes wrong before its first call starts is given back as text; an open call at
the end of the output ends with the arguments read so far.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum, auto
from typing import Any

from zllm.canonical import (
    FunctionTool,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.base import StreamParser
from zllm.dialects.dsml.format import (
    BLOCK_NAMES,
    BLOCK_SEPARATOR,
    DSML,
    DSML_ASCII,
    THINK_CLOSE,
    THINK_OPEN,
    DsmlTags,
    argument_fragment,
    decode_value,
)
from zllm.dialects.scan import TagScanner


class _State(Enum):
    """Where the parser is in the markup; each state has its own tags and two handlers, `_text_in_<state>`
    for the text before a tag and `_tag_in_<state>` for the tag."""

    REASONING = auto()
    CONTENT = auto()
    BLOCK = auto()          # inside a block, between invokes
    INVOKE_NAME = auto()    # after `<｜DSML｜invoke name="`, until `">`
    INVOKE_BODY = auto()    # inside an invoke, between parameters
    PARAM_HEAD = auto()     # after `<｜DSML｜parameter name="`, until `>`
    PARAM_VALUE = auto()    # the value, until `</｜DSML｜parameter>`


class Kind(Enum):
    BLOCK_OPEN = auto()
    BLOCK_CLOSE = auto()
    INVOKE_OPEN = auto()
    INVOKE_CLOSE = auto()
    PARAM_OPEN = auto()
    PARAM_CLOSE = auto()
    THINK_OPEN = auto()
    THINK_CLOSE = auto()
    HEAD_END = auto()


_VARIANTS = [DsmlTags(block, marker) for marker in (DSML, DSML_ASCII) for block in BLOCK_NAMES]
_KIND: dict[str, Kind] = {THINK_OPEN: Kind.THINK_OPEN, THINK_CLOSE: Kind.THINK_CLOSE, '">': Kind.HEAD_END,
                          ">": Kind.HEAD_END}
for _tags in _VARIANTS:
    _KIND.update({
        _tags.block_open: Kind.BLOCK_OPEN, BLOCK_SEPARATOR + _tags.block_open: Kind.BLOCK_OPEN,
        _tags.block_close: Kind.BLOCK_CLOSE, _tags.invoke_open: Kind.INVOKE_OPEN,
        _tags.invoke_close: Kind.INVOKE_CLOSE, _tags.param_open: Kind.PARAM_OPEN, _tags.param_close: Kind.PARAM_CLOSE,
    })


def _tags_of(*kinds: Kind, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(tag for tag, kind in _KIND.items() if kind in kinds and tag not in ('">', ">")) + extra


_TAGS: dict[_State, tuple[str, ...]] = {
    _State.REASONING: _tags_of(Kind.THINK_OPEN, Kind.THINK_CLOSE, Kind.BLOCK_OPEN),
    _State.CONTENT: _tags_of(Kind.THINK_OPEN, Kind.THINK_CLOSE, Kind.BLOCK_OPEN, Kind.BLOCK_CLOSE,
                            Kind.INVOKE_CLOSE, Kind.PARAM_CLOSE),
    _State.BLOCK: _tags_of(Kind.INVOKE_OPEN, Kind.BLOCK_CLOSE),
    _State.INVOKE_NAME: ('">',),
    _State.INVOKE_BODY: _tags_of(Kind.PARAM_OPEN, Kind.INVOKE_CLOSE, Kind.INVOKE_OPEN, Kind.BLOCK_CLOSE),
    _State.PARAM_HEAD: (">",),
    _State.PARAM_VALUE: _tags_of(Kind.PARAM_CLOSE, Kind.INVOKE_CLOSE),
}
_PARAM_HEAD = re.compile(r'([^"]*)"(?:\s+string="(true|false)")?\s*')


class DsmlStreamParser(StreamParser):
    def __init__(self, tools: tuple[FunctionTool, ...], *, thinking: bool, new_call_id: Callable[[], str]):
        self._schemas = {tool.name: tool.parameters for tool in tools}
        self._new_call_id = new_call_id
        self._state = _State.REASONING if thinking else _State.CONTENT
        self._text_handlers: dict[_State, Callable[[str, list], str]] = {
            _State.REASONING: self._text_in_reasoning, _State.CONTENT: self._text_in_content,
            _State.BLOCK: self._text_in_block, _State.INVOKE_NAME: self._text_in_invoke_name,
            _State.INVOKE_BODY: self._text_in_invoke_body, _State.PARAM_HEAD: self._text_in_param_head,
            _State.PARAM_VALUE: self._text_in_param_value,
        }
        self._tag_handlers: dict[_State, Callable[[str, Kind, list], None]] = {
            _State.REASONING: self._tag_in_reasoning, _State.CONTENT: self._tag_in_content,
            _State.BLOCK: self._tag_in_block, _State.INVOKE_NAME: self._tag_in_invoke_name,
            _State.INVOKE_BODY: self._tag_in_invoke_body, _State.PARAM_HEAD: self._tag_in_param_head,
            _State.PARAM_VALUE: self._tag_in_param_value,
        }
        self._scanner = TagScanner(_TAGS[self._state])
        self._at_start = True      # nothing read yet (a leading `<think>` is a slip, not text)
        self._raw = ""             # markup read since the last committed event: given back as text if it fails
        self._stray = ""           # text between tags inside a block
        self._calls_started = 0
        self._calls_completed = 0
        self._block_calls = 0      # calls started in the current block
        self._call: _OpenCall | None = None
        self._param: tuple[str, bool | None] | None = None
        self._value = ""

    @property
    def calls_completed(self) -> int:
        return self._calls_completed

    def feed(self, text: str) -> list:
        events: list = []
        pending: str | None = text
        while pending:
            pending = self._consume(pending, events)
        return events

    def finish(self) -> list:
        events: list = []
        # held text can no longer become a tag: it is text of the current state (what a failed markup
        # leaves unread is rescanned in the state it falls back to, and may hold text again)
        while held := "".join(p.text for p in self._scanner.flush()):
            unread = self._on_text(held, events)
            if self._tags_changed():
                self._scanner.tags = _TAGS[self._state]
            if unread:
                events.extend(self.feed(unread))
        self._flush_stray(events)
        self._close_at_end(events)
        return events

    # ------------------------------------------------------------------------------------------ scanning

    def _consume(self, text: str, events: list) -> str | None:
        """Scan `text` with the current state's tags; when the state changes, return what is left to rescan
        with the new state's tags (the held partial tag included), else None."""
        pieces = self._scanner.feed(text)
        for n, piece in enumerate(pieces):
            if piece.text:
                unread = self._on_text(piece.text, events)
                if self._tags_changed():
                    return self._rescan(unread + (piece.tag or "") + _joined(pieces[n + 1:]))
            if piece.tag is not None:
                self._on_tag(piece.tag, events)
                if self._tags_changed():
                    return self._rescan(_joined(pieces[n + 1:]))
        return None

    def _tags_changed(self) -> bool:
        return _TAGS[self._state] is not self._scanner.tags

    def _rescan(self, rest: str) -> str | None:
        held = "".join(p.text for p in self._scanner.flush())
        self._scanner.tags = _TAGS[self._state]
        return (rest + held) or None

    def _enter(self, state: _State) -> None:
        self._state = state

    # ---------------------------------------------------------------------------------------------- text

    def _on_text(self, text: str, events: list) -> str:
        """Handle text read in the current state; return the part left unread when the state changed on the
        way (it is rescanned with the new state's tags)."""
        rest = self._text_handlers[self._state](text, events)
        self._at_start = False
        return rest

    def _text_in_reasoning(self, text: str, events: list) -> str:
        events.append(ReasoningDelta(text))
        return ""

    def _text_in_content(self, text: str, events: list) -> str:
        events.append(TextDelta(text))
        return ""

    def _text_in_block(self, text: str, events: list) -> str:
        if self._block_calls == 0:  # before its first call, a block holds only layout
            return self._until_bad(text, lambda c: not c.isspace(), events, self._give_back)
        self._stray += text
        return ""

    def _text_in_invoke_name(self, text: str, events: list) -> str:
        return self._until_bad(text, lambda c: c in '<>\n', events, self._give_back)

    def _text_in_invoke_body(self, text: str, events: list) -> str:
        self._stray += text
        return ""

    def _text_in_param_head(self, text: str, events: list) -> str:
        return self._until_bad(text, lambda c: c in '<\n', events, self._drop_param)

    def _text_in_param_value(self, text: str, events: list) -> str:
        self._value += text
        return ""

    def _until_bad(self, text: str, bad: Callable[[str], bool], events: list, fail: Callable[[list], None]) -> str:
        """Markup text up to its first character that cannot be there; at that character the markup failed:
        `fail` gives what was read back as text and what follows is rescanned. Deciding at the first bad
        character (not at a chunk's end) keeps the result independent of how the text was split."""
        at = next((i for i, c in enumerate(text) if bad(c)), None)
        if at is None:
            self._raw += text
            return ""
        self._raw += text[:at + 1]
        fail(events)
        return text[at + 1:]

    def _flush_stray(self, events: list) -> None:
        """Text between tags inside a block: whitespace is layout, anything else is given back as text."""
        if self._stray.strip():
            events.append(TextDelta(self._stray))
        self._stray = ""

    def _give_back(self, events: list) -> None:
        """A block or invoke tag that did not lead to a call: its text is content after all."""
        events.append(TextDelta(self._raw))
        self._raw = ""
        self._enter(_State.BLOCK if self._block_calls else _State.CONTENT)

    def _drop_param(self, events: list) -> None:
        events.append(TextDelta(self._raw))
        self._raw = ""
        self._enter(_State.INVOKE_BODY)

    # ---------------------------------------------------------------------------------------------- tags

    def _on_tag(self, tag: str, events: list) -> None:
        self._flush_stray(events)
        self._tag_handlers[self._state](tag, _KIND[tag], events)
        self._at_start = False

    def _tag_in_reasoning(self, tag: str, kind: Kind, events: list) -> None:
        if kind is Kind.THINK_CLOSE:
            self._enter(_State.CONTENT)
        elif kind is Kind.BLOCK_OPEN:  # the model forgot `</think>`: the call block still counts
            self._open_block(tag)
        elif not self._at_start:
            events.append(ReasoningDelta(tag))

    def _tag_in_content(self, tag: str, kind: Kind, events: list) -> None:
        if kind is Kind.BLOCK_OPEN:
            self._open_block(tag)
        elif kind is Kind.THINK_OPEN and self._at_start:
            self._enter(_State.REASONING)
        elif kind is Kind.THINK_OPEN:
            events.append(TextDelta(tag))
        # a stray `</think>` or DSML closer in content is dropped

    def _tag_in_block(self, tag: str, kind: Kind, events: list) -> None:
        self._raw += tag
        if kind is Kind.INVOKE_OPEN:
            self._enter(_State.INVOKE_NAME)
        else:
            self._end_block()

    def _tag_in_invoke_name(self, tag: str, kind: Kind, events: list) -> None:
        self._start_call(tag, events)  # `">` ends the name

    def _tag_in_invoke_body(self, tag: str, kind: Kind, events: list) -> None:
        if kind is Kind.PARAM_OPEN:
            self._raw = tag
            self._enter(_State.PARAM_HEAD)
            return
        # a next invoke or the block's end also ends this call: the model is done with it
        self._end_call(events, closed=True)
        if kind is Kind.INVOKE_OPEN:  # the previous invoke was not closed
            self._raw = tag
            self._enter(_State.INVOKE_NAME)
        elif kind is Kind.BLOCK_CLOSE:
            self._end_block()

    def _tag_in_param_head(self, tag: str, kind: Kind, events: list) -> None:
        self._param_header(events)  # `>` ends the header

    def _tag_in_param_value(self, tag: str, kind: Kind, events: list) -> None:
        self._end_param(events)
        if kind is Kind.INVOKE_CLOSE:  # the parameter's closer was left out
            self._end_call(events, closed=True)

    def _open_block(self, tag: str) -> None:
        self._raw, self._block_calls = tag, 0
        self._enter(_State.BLOCK)

    def _end_block(self) -> None:
        self._raw = ""
        self._enter(_State.CONTENT)

    # --------------------------------------------------------------------------------------------- calls

    def _start_call(self, tag: str, events: list) -> None:
        name = self._raw[self._raw.rindex('name="') + len('name="'):]
        if not name:
            self._raw += tag
            self._give_back(events)
            return
        index = self._calls_started
        self._call = _OpenCall(index, name, self._schemas.get(name))
        self._calls_started += 1
        self._block_calls += 1
        self._raw = ""
        events.append(ToolCallStart(index, self._new_call_id(), name))
        self._enter(_State.INVOKE_BODY)

    def _param_header(self, events: list) -> None:
        match = _PARAM_HEAD.fullmatch(self._raw[self._raw.rindex('name="') + len('name="'):])
        if match is None:
            self._raw += ">"
            self._drop_param(events)
            return
        string_attr = None if match.group(2) is None else match.group(2) == "true"
        self._param, self._value, self._raw = (match.group(1), string_attr), "", ""
        self._enter(_State.PARAM_VALUE)

    def _end_param(self, events: list) -> None:
        name, string_attr = self._param
        fragment = self._call.add(name, decode_value(self._value, string_attr, self._call.schema_of(name)))
        events.append(ToolCallArgsDelta(self._call.index, fragment))
        self._param, self._value = None, ""
        self._enter(_State.INVOKE_BODY)

    def _end_call(self, events: list, *, closed: bool) -> None:
        call, self._call = self._call, None
        events.append(ToolCallArgsDelta(call.index, call.closing()))
        events.append(ToolCallEnd(call.index, call.arguments))
        self._calls_completed += int(closed)
        self._raw = ""
        self._enter(_State.BLOCK)

    def _close_at_end(self, events: list) -> None:
        state = self._state
        # a block or invoke tag that never led to a call is text after all
        unfinished = state is _State.INVOKE_NAME or (state is _State.BLOCK and not self._block_calls)
        if unfinished and self._raw:
            events.append(TextDelta(self._raw))
        elif state is _State.PARAM_VALUE:
            self._end_param(events)
        if self._call is not None:
            self._end_call(events, closed=False)


def _joined(pieces: list) -> str:
    return "".join(p.text + (p.tag or "") for p in pieces)


class _OpenCall:
    """The call being read: its arguments JSON grows one parameter at a time."""

    def __init__(self, index: int, name: str, parameters: dict | None):
        self.index = index
        self.name = name
        self._properties = (parameters or {}).get("properties") or {}
        self.arguments = ""

    def schema_of(self, name: str) -> dict | None:
        schema = self._properties.get(name)
        return schema if isinstance(schema, dict) else None

    def add(self, name: str, value: Any) -> str:
        fragment = argument_fragment(not self.arguments, name, value)
        self.arguments += fragment
        return fragment

    def closing(self) -> str:
        fragment = "}" if self.arguments else "{}"
        self.arguments += fragment
        return fragment
