"""An incremental JSON checker for the body of a Hermes tool call, one character at a time.

    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ^ top-level object      ^ member     ^ member value (depth 1): where it starts and ends is reported

The parser needs three facts as the body streams in, before the object is complete: is what came so far still
a valid JSON prefix, which member key is open, and where each member value of the top-level object starts and
ends (so the `arguments` value can be streamed as it arrives, and never the object's closing `}`). A full
parse per character would be O(n²); this is a small pushdown automaton instead.

Leniency, deliberately: raw control characters (a literal newline in a string, common when a model writes
code) are accepted, as Python's `json.loads(strict=False)` does; the arguments are kept as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from enum import Enum, auto

WHITESPACE = " \t\n\r"
_ESCAPES = '"\\/bfnrtu'
_HEX = "0123456789abcdefABCDEF"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_NUMBER_CHARS = "0123456789+-.eE"
_LITERALS = ("true", "false", "null")


class _State(Enum):
    """Where the cursor is in the JSON text; each state has one handler, `_in_<state>`."""

    VALUE = auto()  # a value may start
    FIRST_ITEM = auto()  # after `[`: a value or `]`
    AFTER_VALUE = auto()  # `,` or the container's closer
    DONE = auto()  # the top-level object closed: only whitespace
    FIRST_KEY = auto()  # after `{`: a key or `}`
    KEY = auto()  # after `,` in an object: a key
    COLON = auto()  # after a key
    STRING = auto()
    ESCAPE = auto()  # after `\` in a string
    UNICODE = auto()  # inside `\uXXXX`
    NUMBER = auto()
    LITERAL = auto()  # true / false / null


class JsonCursor:
    """Feed one character at a time with `step`; read the outcome from the attributes it sets.

    After each `step(ch)`:
    - `error`: the text is no longer a JSON prefix (sticky; `ch` is not part of a valid prefix)
    - `member_started`: `ch` is the first character of a member value of the top-level object
    - `member_ended_before`: a member value (a number or literal) ended just before `ch`
    - `member_ended_with`: `ch` is the last character of a member value (string quote, closing bracket)
    - `key`: the member key whose closing quote `ch` is (decoded), else None
    - `done`: `ch` closed the top-level object
    """

    def __init__(self) -> None:
        self.stack: list[str] = []  # open containers, "{" or "["
        self._state = _State.VALUE
        self._handlers: dict[_State, Callable[[str], bool]] = {
            _State.VALUE: self._in_value, _State.FIRST_ITEM: self._in_first_item,
            _State.AFTER_VALUE: self._in_after_value, _State.DONE: self._in_done, _State.FIRST_KEY: self._in_first_key,
            _State.KEY: self._in_key, _State.COLON: self._in_colon, _State.STRING: self._in_string,
            _State.ESCAPE: self._in_escape, _State.UNICODE: self._in_unicode, _State.NUMBER: self._in_number,
            _State.LITERAL: self._in_literal,
        }
        self.error = False
        self.done = False
        self._string_is_key = False
        self._token = ""  # the key being read (raw, quotes included), or the number / literal being read
        self._hex_left = 0
        self._clear_flags()

    def _clear_flags(self) -> None:
        self.member_started = self.member_ended_before = self.member_ended_with = False
        self.key: str | None = None

    def step(self, ch: str) -> None:
        self._clear_flags()
        if self.error:
            return
        if not self._handlers[self._state](ch):
            self.error = True

    # ---------------------------------------------------------------------------------------- values

    def _in_value(self, ch: str, *, closing: str | None = None) -> bool:
        if ch in WHITESPACE:
            return True
        if closing is not None and ch == closing:  # `[]`: an empty array
            return self._close(ch)
        if not self.stack and ch != "{":  # a call body is an object, nothing else
            return False
        if len(self.stack) == 1:
            self.member_started = True
        if ch in "{[":
            self.stack.append(ch)
            self._state = _State.FIRST_KEY if ch == "{" else _State.FIRST_ITEM
            return True
        if ch == '"':
            self._string_is_key, self._state = False, _State.STRING
            return True
        if ch in _NUMBER_CHARS and ch not in "+.eE":
            self._token, self._state = ch, _State.NUMBER
            return True
        if any(word.startswith(ch) for word in _LITERALS):
            self._token, self._state = ch, _State.LITERAL
            return True
        return False

    def _in_first_item(self, ch: str) -> bool:
        return self._in_value(ch, closing="]")

    def _value_ended(self) -> None:
        """A value just ended (its last character was the current one, or the one before)."""
        self._state = _State.AFTER_VALUE if self.stack else _State.DONE

    def _in_after_value(self, ch: str) -> bool:
        if ch in WHITESPACE:
            return True
        if ch == ",":
            self._state = _State.KEY if self.stack[-1] == "{" else _State.VALUE
            return True
        return self._close(ch)

    def _close(self, ch: str) -> bool:
        if not self.stack or ch != {"{": "}", "[": "]"}[self.stack[-1]]:
            return False
        self.stack.pop()
        if len(self.stack) == 1:
            self.member_ended_with = True
        self.done = not self.stack
        self._value_ended()
        return True

    def _in_done(self, ch: str) -> bool:
        return ch in WHITESPACE

    # ------------------------------------------------------------------------------------------ keys

    def _in_first_key(self, ch: str) -> bool:
        if ch == "}":
            return self._close(ch)
        return self._in_key(ch)

    def _in_key(self, ch: str) -> bool:
        if ch in WHITESPACE:
            return True
        if ch != '"':
            return False
        self._string_is_key, self._token, self._state = True, '"', _State.STRING
        return True

    def _in_colon(self, ch: str) -> bool:
        if ch in WHITESPACE:
            return True
        if ch != ":":
            return False
        self._state = _State.VALUE
        return True

    # --------------------------------------------------------------------------------------- strings

    def _in_string(self, ch: str) -> bool:
        if self._string_is_key:
            self._token += ch
        if ch == "\\":
            self._state = _State.ESCAPE
        elif ch == '"':
            self._string_ended()
        return True

    def _string_ended(self) -> None:
        if self._string_is_key:
            if len(self.stack) == 1:
                self.key = json.loads(self._token, strict=False)
            self._state = _State.COLON
            return
        if len(self.stack) == 1:
            self.member_ended_with = True
        self._value_ended()

    def _in_escape(self, ch: str) -> bool:
        if self._string_is_key:
            self._token += ch
        if ch not in _ESCAPES:
            return False
        if ch == "u":
            self._hex_left, self._state = 4, _State.UNICODE
        else:
            self._state = _State.STRING
        return True

    def _in_unicode(self, ch: str) -> bool:
        if self._string_is_key:
            self._token += ch
        if ch not in _HEX:
            return False
        self._hex_left -= 1
        if not self._hex_left:
            self._state = _State.STRING
        return True

    # ------------------------------------------------------------------------------ numbers, literals

    def _in_number(self, ch: str) -> bool:
        if ch in _NUMBER_CHARS:
            self._token += ch
            return True
        if not _NUMBER.match(self._token):
            return False
        return self._primitive_ended(ch)

    def _in_literal(self, ch: str) -> bool:
        candidate = self._token + ch
        if any(word.startswith(candidate) for word in _LITERALS):
            self._token = candidate
            return True
        if self._token not in _LITERALS:
            return False
        return self._primitive_ended(ch)

    def _primitive_ended(self, ch: str) -> bool:
        """A number or literal ends at the first character that cannot extend it; that character is then
        read as whatever follows a value."""
        if len(self.stack) == 1:
            self.member_ended_before = True
        self._value_ended()
        return self._in_after_value(ch)
