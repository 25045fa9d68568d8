"""Model output → canonical events for a derived format (format.py): a state machine over the format's literals.

Each state scans for the literals that may come next (TagScanner, partial-literal holdback), so the events
depend only on the whole text, never on how it was cut. Arguments stream as JSON: a `json` format's object as
written; a `tagged` format's pairs converted (string parameters raw → JSON strings, others read as JSON) with
the tool schemas, as GLM's parser does. Anything that does not follow the format is given back as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum, auto

from zllm.canonical import Event, FunctionTool, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from zllm.dialects.bare_json import BareCallReader, reads_bare
from zllm.dialects.base import StreamParser
from zllm.dialects.derived.format import ID_SLOT, NAME_SLOT, CallFormat, split_slot
from zllm.dialects.derived.ids import with_written_id
from zllm.dialects.derived.kwargs import KwargsCursor
from zllm.dialects.derived.notation import NotationCursor
from zllm.dialects.derived.probe import split_markers
from zllm.dialects.derived.xml_values import XmlValueCursor
from zllm.dialects.glm.format import param_schemas, string_param, value_json
from zllm.dialects.hermes.json_cursor import JsonCursor
from zllm.dialects.scan import TagScanner

_NAME_LIMIT = 256


def _one_word(written: str) -> bool:
    """Whether what was read where a name or an id goes can be one: a word, no longer than a name may be."""
    return bool(written) and not any(c.isspace() for c in written) and len(written) <= _NAME_LIMIT


# a tagged value as a template's `| string` writes it (format.py `python_constants`) → its JSON
PYTHON_CONSTANTS = {"True": "true", "False": "false", "None": "null"}


class _State(Enum):
    START = auto()  # reasoning may open
    REASONING = auto()
    TEXT = auto()
    NAME = auto()
    JSON_ARGS = auto()
    NOTATION_ARGS = auto()  # arguments in the template's own notation (notation.py), streamed as JSON
    KWARGS_ARGS = auto()  # keyword arguments in Python-call notation (kwargs.py), through the call's closer
    CALL_CLOSE = auto()  # after a JSON object: the call's closer
    KEY = auto()
    TYPE = auto()  # the value's type word, inside `param_mid` (format.py `type_words`)
    VALUE = auto()
    XML_VALUE = auto()  # a non-string value written as elements (xml_values.py)
    AFTER_PARAM = auto()  # another parameter, or the call's closer
    AFTER_CALL = auto()  # another call, or the section's end
    SLOT = auto()  # the call's id or index, inside the name's or the call's closer (format.py `slot`)
    BARE = auto()  # the content opened with `{`: a bare JSON call, or text (bare_json.py)


class DerivedParser(StreamParser):
    def __init__(self, fmt: CallFormat, tools: tuple[FunctionTool, ...], new_call_id: Callable[[], str], *,
                 thinking: bool):
        self.f = fmt
        self._tools = {tool.name: tool for tool in tools}
        self._new_call_id = new_call_id
        # up to the call's id where the opener holds it (Solar Open's `<|tool_call:begin|>ID<|tool_call:name|>`)
        self._openers = tuple(dict.fromkeys(split_slot(o)[0] for o in (
            fmt.content_sep + fmt.section_open + fmt.call_open, fmt.section_open + fmt.call_open) if o))
        self._opened = ""  # the opener the open call's name follows, given back as text if it is no call
        self._events: list[Event] = []
        self._slot = ""  # the id / index text read so far
        self._started = False  # the open call's ToolCallStart is out (held until its written id is read)
        # the literal that holds the slot: "name_close", "call_close", "call_open" or ""
        # (the name written again, NAME_SLOT, is read as a slot in name_close and must repeat the name)
        self._slot_in = "name_close" if NAME_SLOT in fmt.name_close else next(
            (n for n in ("name_close", "call_close", "call_open") if fmt.slot and fmt.slot in getattr(fmt, n)), "")
        self._scanner = _PatientScanner(())
        self._start = ""
        self._state = _State.START
        if fmt.gen_in_think:
            self._go(_State.REASONING)
        elif not (fmt.think_open and thinking) and not fmt.empty_think:
            self._go(_State.TEXT)
        self._call_index = -1
        self._completed = 0
        self._name = ""
        self._args = ""  # the JSON arguments streamed so far for the open call
        self._cursor: JsonCursor | None = None
        self._key = ""
        self._value = ""
        self._type = ""  # the type word read for the open parameter
        self._xml: XmlValueCursor | None = None
        # a bare JSON call may open the content (bare_json.py), where the format's own calls do not open with `{`
        self._bare_tools = frozenset(self._tools) if reads_bare(fmt.section_open + fmt.call_open) else frozenset()
        self._bare: BareCallReader | None = None
        self._content_begun = False
        # the whitespace the template opens every turn with (format.py `content_lead`): dropped as framing,
        # held while it may still be arriving
        self._lead_open = bool(fmt.content_lead)
        self._lead_seen = ""
        # the text the template writes before its end-of-turn marker (Reka Edge's `\n\n<sep>`): the model writes it
        # before the token generation stops at, so at the very end of the output it is framing, dropped; held
        # while it may be
        head = split_markers(fmt.turn_end)[0] if fmt.turn_end else ""
        self._end_head = head if head != fmt.turn_end and head.isspace() else ""
        self._end_held = ""
        # the text's own lead (format.py `text_lead`): dropped where the turn opens with it; where it does not,
        # the turn opens with its calls
        self._text_lead_open = bool(fmt.text_lead)

    @property
    def calls_completed(self) -> int:
        return self._completed

    # ------------------------------------------------------------------------------------ driving

    def feed(self, text: str) -> list[Event]:
        self._run(text)
        return self._take()

    def finish(self) -> list[Event]:
        if self._state is _State.START:
            start, self._start = self._start, ""
            self._go(_State.TEXT)
            self._run(start)
        if (self._lead_open or self._text_lead_open) and self._lead_seen:  # a part of a lead, then the end: text
            seen, self._lead_seen, self._lead_open, self._text_lead_open = self._lead_seen, "", False, False
            self._run(seen)
        if self._state is _State.BARE:
            self._events += self._bare.finish()
            self._completed += self._bare.calls_completed
            self._call_index += self._bare.calls_started
            self._bare = None
            self._go(_State.TEXT)
        held = "".join(piece.text for piece in self._scanner.flush())
        state = self._state
        if state in (_State.TEXT, _State.AFTER_CALL):
            close = self.f.text_close
            if close and held.startswith(close) and not held[len(close):].strip():
                held = ""  # the text's closing framing, held while it could open a call (GigaChat 3): dropped
            ending = self.f.section_close
            if state is _State.AFTER_CALL and held and ending.startswith(held) and not ending[len(held):].strip():
                held = ""  # the calls' closer without its last whitespace: the turn ended there (Command R+'s `]````)
            self._text(held)
        elif state is _State.REASONING:
            self._reasoning(held)
        elif state is _State.NAME:
            self._text(self._opened + self._name + held)
        elif state is _State.JSON_ARGS:
            self._emit_args(held)
            self._end_call(completed=False)
        elif state in (_State.NOTATION_ARGS, _State.KWARGS_ARGS):
            self._end_call(completed=False)
        elif state is _State.SLOT and self._slot_in == "call_open":  # no call yet: an opener and its text
            self._text(self._opened + self._slot + held)
        elif state is _State.SLOT:
            self._end_call(completed=False)
            self._text(self._slot + held)
        elif state in (_State.KEY, _State.TYPE, _State.VALUE, _State.XML_VALUE, _State.AFTER_PARAM,
                       _State.CALL_CLOSE):
            if state is _State.VALUE:
                self._value += held
                self._end_param()
            elif state is _State.XML_VALUE:
                self._value = self._xml.raw
                self._xml = None
                self._end_param()
            self._end_call(completed=False)
        self._go(_State.TEXT)
        events = self._take()
        held, self._end_held = self._end_held, ""
        if held and held != self._end_head:  # not the turn end's text: the turn's own
            events.append(TextDelta(held))
        return events

    def _run(self, text: str) -> None:
        if self._state is _State.START:
            text = self._in_start(text)
        pending = text
        while pending:
            if self._state is _State.TEXT and self._lead_open:
                pending = self._in_lead(pending)
                continue
            if self._state is _State.TEXT and self._text_lead_open:
                pending = self._in_text_lead(pending)
                continue
            if self._state is _State.TEXT and not self._content_begun:
                self._content_begun = True
                if self._bare_tools and pending.startswith("{"):
                    self._bare = BareCallReader(self._bare_tools, self._new_call_id)
                    self._state = _State.BARE
            if self._state is _State.BARE:
                pending = self._in_bare(pending)
                continue
            if self._state is _State.JSON_ARGS:
                pending = self._in_json(pending)
                continue
            if self._state is _State.NOTATION_ARGS:
                pending = self._in_notation(pending)
                continue
            if self._state is _State.KWARGS_ARGS:
                pending = self._in_kwargs(pending)
                continue
            if self._state is _State.XML_VALUE:
                pending = self._in_xml_value(pending)
                continue
            pieces = self._scanner.feed(pending)
            if not pieces:
                return
            first, rest = pieces[0], "".join(p.text + (p.tag or "") for p in pieces[1:])
            given_back = self._handle(first.text, first.tag)
            if first.tag is None and not given_back:
                return
            pending = given_back + rest + "".join(piece.text for piece in self._scanner.flush())

    def _go(self, state: _State) -> None:
        self._state = state
        f = self.f
        self._scanner.tags = {
            _State.REASONING: (f.think_close,),
            _State.TEXT: (*self._openers, f.text_close),
            _State.NAME: ((f.name_close + f.param_open, f.name_close + f.call_close)
                          if f.tagged and self._slot_in != "name_close"
                          else (f.name_close + "{",) if f.notation else (split_slot(f.name_close)[0],)),
            _State.CALL_CLOSE: (split_slot(f.call_close)[0], f.bare_call_close),
            _State.SLOT: (split_slot(getattr(f, self._slot_in or "name_close"))[1],),
            _State.KEY: (split_slot(f.param_mid)[0],),
            _State.TYPE: (split_slot(f.param_mid)[1],),
            _State.VALUE: (f.close_of(getattr(self, "_key", "")),),
            _State.AFTER_PARAM: (f.param_open, f.call_close),
            _State.AFTER_CALL: tuple(t for t in (split_slot(f.call_sep + f.call_open)[0], f.section_close) if t),
        }.get(state, ())
        self._scanner.tags = tuple(tag for tag in self._scanner.tags if tag)  # an empty literal is no tag

    def _in_start(self, text: str) -> str:
        self._start += text
        opener = self.f.think_open
        if opener.startswith(self._start) and self._start != opener:
            return ""
        if self.f.empty_think:  # a turn without reasoning opens with the closer alone: framing, dropped
            closer = self.f.think_close
            if closer.startswith(self._start) and self._start != closer:
                return ""
            if self._start.startswith(closer):
                start, self._start = self._start, ""
                self._go(_State.TEXT)
                return start[len(closer):]
        start, self._start = self._start, ""
        if start.startswith(opener):
            self._go(_State.REASONING)
            return start[len(opener):]
        self._go(_State.TEXT)
        return start

    def _handle(self, text: str, tag: str | None) -> str:
        state = self._state
        if state is _State.REASONING:
            self._reasoning(text)
            if tag is not None:
                self._go(_State.TEXT)
            return ""
        if state is _State.TEXT:
            self._text(text)
            if tag is not None and tag == self.f.text_close and tag not in self._openers:
                return ""  # the text's closing framing (Kimi K3): dropped
            if tag is not None:
                self._open_call(tag)
            return ""
        return {_State.NAME: self._in_name, _State.CALL_CLOSE: self._in_call_close, _State.KEY: self._in_key,
                _State.TYPE: self._in_type,
                _State.VALUE: self._in_value, _State.AFTER_PARAM: self._in_after_param, _State.SLOT: self._in_slot,
                _State.AFTER_CALL: self._in_after_call}[state](text, tag)

    def _in_lead(self, text: str) -> str:
        """The turn's opening, while it may be the format's content lead: the lead dropped, what follows (or
        what proved not to be the lead) given back; "" while it may still be arriving."""
        lead, seen = self.f.content_lead, self._lead_seen + text
        if lead.startswith(seen) and seen != lead:
            self._lead_seen = seen
            return ""
        self._lead_seen, self._lead_open = "", False
        return seen.removeprefix(lead)

    def _in_text_lead(self, text: str) -> str:
        """The turn's opening, while it may be the text's own lead (format.py `text_lead`): dropped, and the turn
        is text; a turn that opens otherwise opens with its calls (with the name itself where the calls have no
        opener of their own: functionary v3.2's `NAME\\n{...}` against `all\\n` text)."""
        lead, seen = self.f.text_lead, self._lead_seen + text
        if lead.startswith(seen) and seen != lead:
            self._lead_seen = seen
            return ""
        self._lead_seen, self._text_lead_open = "", False
        if seen.startswith(lead):  # the text follows (or a bare JSON call, written as the text: bare_json.py)
            return seen[len(lead):]
        if not (self.f.section_open + self.f.call_open):
            self._open_call("")
        return seen

    def _open_call(self, opener: str) -> None:
        """An opener was read: the name follows, or first the call's id (format.py `slot` in `call_open`)."""
        self._opened, self._name, self._slot = opener, "", ""
        self._go(_State.SLOT if self._slot_in == "call_open" else _State.NAME)

    def _in_bare(self, text: str) -> str:
        """The content's opening object, read by the bare reader; once it ended, what followed is read here."""
        bare = self._bare
        self._events += bare.feed(text)
        if not bare.done:
            return ""
        self._completed += bare.calls_completed
        self._call_index += bare.calls_started  # this format's calls are numbered after a bare one
        self._bare = None
        self._go(_State.TEXT)
        return bare.take_rest()

    # ------------------------------------------------------------------------------------ calls

    def _in_name(self, text: str, tag: str | None) -> str:
        self._name += text
        if tag is None and len(self._name) <= _NAME_LIMIT:
            return ""
        name = self._name
        if tag is None or not _one_word(name):
            self._text(self._opened + name)  # not a call after all
            self._go(_State.TEXT)
            return tag or ""
        self._call_index += 1
        self._started = False
        self._args = ""
        if not self._slot_in:
            self._start_call("")
        elif self._slot_in == "call_open":  # the id was read before the name
            self._start_call(self._slot if self.f.slot == ID_SLOT else "")
        if self._slot_in == "name_close":
            self._slot = ""
            self._go(_State.SLOT)
        elif self.f.notation:  # the name ends at the object's brace: the arguments start with it
            f = self.f
            self._cursor = NotationCursor(quote_open=f.quote_open, quote_close=f.quote_close, null=f.null_word)
            self._emit_args(self._cursor.step("{"))
            self._state = _State.NOTATION_ARGS
        elif self.f.kwargs:  # the name ends at the opening parenthesis: keyword arguments to the closing one
            f = self.f
            self._cursor = KwargsCursor(f, call_sep=f.call_sep + f.call_open, section_close=f.section_close,
                                        name_close=f.name_close)
            self._emit_args(self._cursor.start())
            self._state = _State.KWARGS_ARGS
        elif not self.f.tagged:
            self._cursor = JsonCursor()
            self._state = _State.JSON_ARGS
        elif tag == self.f.name_close + self.f.call_close:
            self._end_call(completed=True)
            self._go(_State.AFTER_CALL)
        else:
            self._key = ""
            self._go(_State.KEY)
        return ""

    def _in_json(self, text: str) -> str:
        cursor = self._cursor
        for at, ch in enumerate(text):
            cursor.step(ch)
            if cursor.error:
                self._emit_args(text[:at])
                self._end_call(completed=False)
                self._go(_State.TEXT)
                return text[at:]
            if cursor.done:
                self._emit_args(text[:at + 1])
                if self.f.call_close:
                    self._go(_State.CALL_CLOSE)
                else:
                    self._end_call(completed=True)
                    self._go(_State.AFTER_CALL)
                return text[at + 1:]
        self._emit_args(text)
        return ""

    def _in_notation(self, text: str) -> str:
        # the call's closer follows the value (or there is none)
        return self._in_value_cursor(text, reads_closer=False)

    def _in_kwargs(self, text: str) -> str:
        # the cursor reads the closer too, and gives back what it read past it (`rest`)
        return self._in_value_cursor(text, reads_closer=True)

    def _in_value_cursor(self, text: str, reads_closer: bool) -> str:
        """Arguments read character by character by a notation or kwargs cursor, until it is done or fails."""
        cursor = self._cursor
        out = ""
        for at, ch in enumerate(text):
            piece = cursor.step(ch)
            if cursor.error:  # not the notation: the call ends there, the rest is text
                self._emit_args(out)
                self._end_call(completed=False)
                self._go(_State.TEXT)
                return cursor.rest + text[at:]
            out += piece
            if cursor.done:
                self._emit_args(out)
                if self.f.call_close and not reads_closer:
                    self._go(_State.CALL_CLOSE)
                else:
                    self._end_call(completed=True)
                    self._go(_State.AFTER_CALL)
                return cursor.rest + text[at + 1:]
        self._emit_args(out)
        return ""

    def _in_call_close(self, text: str, tag: str | None) -> str:
        if text or tag is None:  # something else follows the arguments: the call ends, the rest is text
            self._end_call(completed=True)
            self._go(_State.TEXT)
            return text + (tag or "")
        if self._slot_in == "call_close" and tag != self.f.bare_call_close:
            self._slot = ""
            self._go(_State.SLOT)
            return ""
        self._end_call(completed=True)
        self._go(_State.AFTER_CALL)
        return ""

    def _in_slot(self, text: str, tag: str | None) -> str:
        self._slot += text
        if tag is None and len(self._slot) <= _NAME_LIMIT:
            return ""
        written = self._slot
        if self._slot_in == "call_open":  # before the name: no call yet
            return self._slot_read(written, tag)
        if NAME_SLOT in self.f.name_close and written != self._name:  # the name again, not the same: no call
            self._call_index -= 1
            self._text(self._opened + self._name + split_slot(self.f.name_close)[0] + written)
            self._go(_State.TEXT)
            return tag or ""
        if tag is None or not _one_word(written):
            self._end_call(completed=False)  # not an id: the call ends there, the rest is text
            self._text(written)
            self._go(_State.TEXT)
            return tag or ""
        self._start_call(written if self.f.slot == ID_SLOT else "")
        if self._slot_in == "name_close" and self.f.tagged:  # parameters, or the call's closer (Kimi K3)
            self._go(_State.AFTER_PARAM)
        elif self._slot_in == "name_close":
            self._cursor = JsonCursor()
            self._state = _State.JSON_ARGS
        else:
            self._end_call(completed=True)
            self._go(_State.AFTER_CALL)
        return ""

    def _slot_read(self, written: str, tag: str | None) -> str:
        """The id before a call's name: the name follows its closer; anything else was text."""
        if tag is None or not _one_word(written):
            self._text(self._opened + written)
            self._go(_State.TEXT)
            return tag or ""
        self._opened += written + tag
        self._name = ""
        self._go(_State.NAME)
        return ""

    def _in_key(self, text: str, tag: str | None) -> str:
        self._key += text
        if tag is None:
            return ""
        if self.f.type_words:
            self._type = ""
            self._go(_State.TYPE)
            return ""
        self._open_value()
        return ""

    def _in_type(self, text: str, tag: str | None) -> str:
        self._type += text
        if tag is None:
            return ""
        self._open_value()
        return ""

    def _open_value(self) -> None:
        self._value = ""
        tool = self._tools.get(self._current_name())
        if self.f.xml_item and not string_param(tool, param_schemas(tool), self._key):
            self._xml = XmlValueCursor(self.f, self._key)  # nested values as elements: read to its own closer
            self._state = _State.XML_VALUE
        else:
            self._go(_State.VALUE)

    def _in_xml_value(self, text: str) -> str:
        cursor = self._xml
        for at, ch in enumerate(text):
            if cursor.step(ch):
                self._end_param()
                self._xml = None
                self._go(_State.AFTER_PARAM)
                return text[at + 1:]
        return ""

    def _in_value(self, text: str, tag: str | None) -> str:
        self._value += text
        if tag is None:
            return ""
        self._end_param()
        self._go(_State.AFTER_PARAM)
        return ""

    def _in_after_param(self, text: str, tag: str | None) -> str:
        if text or tag is None:
            self._end_call(completed=False)
            self._go(_State.TEXT)
            return text + (tag or "")
        if tag == self.f.param_open:
            self._key = ""
            self._go(_State.KEY)
        else:
            self._end_call(completed=True)
            self._go(_State.AFTER_CALL)
        return ""

    def _in_after_call(self, text: str, tag: str | None) -> str:
        if text or tag is None:
            self._go(_State.TEXT)
            return text + (tag or "")
        if tag == self.f.section_close:
            self._go(_State.TEXT)
        else:
            self._open_call(tag)
        return ""

    def _end_param(self) -> None:
        tool = self._tools.get(self._current_name())
        head = ("{" if not self._args else ", ") + json.dumps(self._key, ensure_ascii=False) + ": "
        raw = self._value
        if self._xml is not None:
            value = self._xml.to_json(param_schemas(tool).get(self._key))
        elif self.f.type_words:  # the type word says how the value is written: strings raw, others JSON
            value = json.dumps(raw, ensure_ascii=False) if self._type == self.f.string_word() else value_json(raw)
        elif string_param(tool, param_schemas(tool), self._key):
            f = self.f
            if f.wrap_open and raw.startswith(f.wrap_open) and raw[len(f.wrap_open):].endswith(f.wrap_close):
                raw = raw[len(f.wrap_open):len(raw) - len(f.wrap_close)]  # MiniCPM5's CDATA
            value = json.dumps(raw, ensure_ascii=False)
        elif self.f.python_constants and raw in PYTHON_CONSTANTS:
            value = PYTHON_CONSTANTS[raw]
        elif self.f.constants == "python-objects":
            value = _python_literal_json(raw)
        else:
            value = value_json(raw)
        self._emit_args(head + value)

    def _current_name(self) -> str:
        return self._name

    def _start_call(self, written_id: str) -> None:
        """The open call's ToolCallStart (with the id the model wrote, where it writes one), then any arguments
        read before it (a format whose id follows the arguments)."""
        call_id = self._new_call_id()
        self._events.append(ToolCallStart(self._call_index, with_written_id(call_id, written_id), self._name))
        self._started = True
        if self._args:
            self._events.append(ToolCallArgsDelta(self._call_index, self._args))

    def _end_call(self, *, completed: bool) -> None:
        if not self._started:
            self._start_call("")
        if self.f.tagged:
            self._emit_args("}" if self._args else "{}")
        self._events.append(ToolCallEnd(self._call_index, self._args))
        self._completed += completed
        self._cursor = None

    def _emit_args(self, text: str) -> None:
        if text:
            self._args += text
            if self._started:
                self._events.append(ToolCallArgsDelta(self._call_index, text))

    # ------------------------------------------------------------------------------------ text

    def _text(self, text: str) -> None:
        if text:
            self._events.append(TextDelta(text))

    def _reasoning(self, text: str) -> None:
        if text:
            self._events.append(ReasoningDelta(text))

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        if not self._end_head:
            return events
        out: list[Event] = []
        for event in events:
            if isinstance(event, TextDelta):
                text = self._end_held + event.text
                keep = next((k for k in range(len(self._end_head), 0, -1) if text.endswith(self._end_head[:k])), 0)
                self._end_held = text[len(text) - keep:]
                if len(text) > keep:
                    out.append(TextDelta(text[:len(text) - keep]))
                continue
            if self._end_held:
                out.append(TextDelta(self._end_held))
                self._end_held = ""
            out.append(event)
        return out


class _PatientScanner(TagScanner):
    """A complete tag that may still grow into a longer one is held until the text tells (MiniMax M3's parameter
    opener `NS<` begins its call closer `NS</invoke>`): the pieces depend only on the whole text."""

    def _first_tag(self, buffer: str) -> tuple[int, str | None]:
        at, tag = super()._first_tag(buffer)
        if tag is not None and any(len(other) > len(buffer) - at and other.startswith(buffer[at:])
                                   for other in self.tags):
            return len(buffer), None
        return at, tag


def _python_literal_json(raw: str) -> str:
    """A value a template wrote with `| string` (a Python literal: `{'a': True}`) as JSON; JSON text as is."""
    import ast

    try:
        return json.dumps(ast.literal_eval(raw.strip()), ensure_ascii=False)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value_json(raw)
