"""Incremental parser of harmony output (gpt-oss) into canonical events.

The output starts inside the first message's header (the prompt ended `<|start|>assistant`):

    <|channel|>analysis<|message|>Paris.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary
    json<|message|>{"city": "Paris"}

→ ReasoningDelta("Paris."), ToolCallStart(0, id, "get_weather"), ToolCallArgsDelta(0, '{"city": "Paris"}'), and at
finish ToolCallEnd(0, '{"city": "Paris"}'): the `<|call|>` that ends the call is a stop token, so the parser
never sees it (an `<|end|>` or `<|call|>` that does arrive closes the call there).

A header is read whole up to `<|message|>`; a recipient `to=functions.NAME` (before or after the channel, as
the template and the harmony renderer each write it) makes the message a call, whatever its channel; otherwise
`analysis` is reasoning and any other channel (final, a commentary preamble) is text. Arguments are the body
as written. Text that cannot be a header (a newline in it, or longer than MAX_HEADER: a model that writes no
harmony at all) is given back as text at the first character that decides it, so the events do not depend on
how the text was split; a header cut short by the end of the output is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum, auto

from zllm.canonical import Event, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from zllm.dialects.base import StreamParser
from zllm.dialects.harmony.format import (
    ANALYSIS,
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    FUNCTIONS,
    MAX_HEADER,
    MESSAGE,
    RETURN,
    START,
)
from zllm.dialects.scan import TagScanner

HEADER_TAGS = (MESSAGE,)
BODY_TAGS = (END, CALL, RETURN, START)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")


class _State(Enum):
    """Where the parser is; each state has a text handler (`_text_in_<state>`, returns the text left unread
    when the state changed on the way, else None) and a tag handler (`_tag_in_<state>`)."""

    HEADER = auto()
    REASONING = auto()
    TEXT = auto()
    CALL = auto()


class HarmonyParser(StreamParser):
    def __init__(self, *, new_call_id: Callable[[], str]):
        self._new_call_id = new_call_id
        self._state = _State.HEADER
        self._scanner = TagScanner(HEADER_TAGS)
        self._header = ""
        self._events: list[Event] = []
        self._call_index = -1
        self._arguments = ""
        self._started = 0
        self._completed = 0
        self._text_handlers: dict[_State, Callable[[str], str | None]] = {
            _State.HEADER: self._text_in_header, _State.REASONING: self._text_in_reasoning,
            _State.TEXT: self._text_in_text, _State.CALL: self._text_in_call,
        }
        self._tag_handlers: dict[_State, Callable[[str], None]] = {
            _State.HEADER: self._tag_in_header, _State.REASONING: self._tag_in_body,
            _State.TEXT: self._tag_in_body, _State.CALL: self._tag_in_body,
        }

    @property
    def calls_completed(self) -> int:
        return self._completed

    def feed(self, text: str) -> list[Event]:
        while text:
            text = self._step(text)
        return self._take()

    def finish(self) -> list[Event]:
        held = "".join(piece.text for piece in self._scanner.flush())
        if self._state is _State.HEADER:
            header = self._header + held
            if header and not _looks_like_header(header):
                self._events.append(TextDelta(header))
            self._header = ""
        else:
            if held:
                self._text_handlers[self._state](held)
            self._end_message(counted=False)
        return self._take()

    # ---------------------------------------------------------------------------------------- scanning

    def _step(self, text: str) -> str:
        """Read `text` in the current state; return what is left to read when the state changed."""
        pieces = self._scanner.feed(text)
        for n, piece in enumerate(pieces):
            rest = "".join(p.text + (p.tag or "") for p in pieces[n + 1:])
            unread = self._text_handlers[self._state](piece.text) if piece.text else None
            if unread is not None:  # a header that is not one: what follows is read as text
                return self._switch(unread + (piece.tag or "") + rest)
            if piece.tag is not None:
                self._tag_handlers[self._state](piece.tag)
                return self._switch(rest)
        return ""

    def _switch(self, rest: str) -> str:
        held = "".join(piece.text for piece in self._scanner.flush())
        self._scanner.tags = HEADER_TAGS if self._state is _State.HEADER else BODY_TAGS
        return rest + held

    # ------------------------------------------------------------------------------------------ header

    def _text_in_header(self, text: str) -> str | None:
        """Add `text` to the header; None while it can still be one, else the text after the character that
        showed it cannot (the header so far, through that character, went out as text)."""
        for at, char in enumerate(text):
            if char == "\n" or len(self._header) + at + 1 > MAX_HEADER:
                self._events.append(TextDelta(self._header + text[:at + 1]))
                self._header = ""
                self._state = _State.TEXT
                return text[at + 1:]
        self._header += text
        return None

    def _tag_in_header(self, tag: str) -> None:
        """`<|message|>`: the header is complete and says what the body is."""
        header, self._header = self._header, ""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None:
            name = recipient.group(1).removeprefix(FUNCTIONS)
            self._call_index, self._arguments = self._started, ""
            self._started += 1
            self._events.append(ToolCallStart(self._call_index, self._new_call_id(), name))
            self._state = _State.CALL
        elif channel is not None and channel.group(1) == ANALYSIS:
            self._state = _State.REASONING
        else:
            self._state = _State.TEXT

    # -------------------------------------------------------------------------------------------- body

    def _text_in_reasoning(self, text: str) -> None:
        self._events.append(ReasoningDelta(text))

    def _text_in_text(self, text: str) -> None:
        self._events.append(TextDelta(text))

    def _text_in_call(self, text: str) -> None:
        self._arguments += text
        self._events.append(ToolCallArgsDelta(self._call_index, text))

    def _tag_in_body(self, tag: str) -> None:
        """A message's end (`<|start|>` too: the model left out `<|end|>`, the next message begins)."""
        self._end_message(counted=tag != START)
        self._header = tag if tag == START else ""

    def _end_message(self, *, counted: bool) -> None:
        if self._state is _State.CALL:
            self._events.append(ToolCallEnd(self._call_index, self._arguments))
            self._completed += counted
        self._state = _State.HEADER

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events


def _looks_like_header(text: str) -> bool:
    """A header the output ended inside (`<|start|>assistant`, ` to=functions.f`): markup, not text."""
    return text.startswith((START, CHANNEL, " to=", CONSTRAIN)) or CHANNEL in text
