"""Arguments written as an object in the template's own notation (`notation` formats, format.py), not JSON: keys
bare, strings between quote markers, numbers and true / false as JSON spells them, null as the template's word
for it, nested objects and arrays alike. Gemma 4:

    {city:<|"|>paris<|"|>,days:3,tags:[<|"|>a<|"|>],x:None}      ↔      {"city": "paris", "days": 3, "tags": ["a"], "x": null}

`write` spells a value as the template does (the probe compares it with the template's own rendering); a
`NotationCursor` reads the notation back one character at a time and gives the JSON text as it goes (so the
parser streams arguments and stays split-invariant), and says when the outer object closes or the text is not
notation.
"""

from __future__ import annotations

import json
import re

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def write(value, *, quote_open: str, quote_close: str, null: str, sorted_keys: bool) -> str:
    """`value` (JSON data) in the notation."""
    def spell(v) -> str:
        if isinstance(v, str):
            return quote_open + v + quote_close
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return null
        if isinstance(v, dict):
            items = sorted(v.items()) if sorted_keys else v.items()
            return "{" + ",".join(f"{k}:{spell(x)}" for k, x in items) + "}"
        if isinstance(v, list):
            return "[" + ",".join(spell(x) for x in v) + "]"
        return str(v)

    return spell(value)


class NotationCursor:
    """`step(ch)` → the JSON text that character completes ("" while it is held: a bare word, part of a quote
    marker). `done` once the outer object closes; `error` when the text is not the notation."""

    def __init__(self, *, quote_open: str, quote_close: str, null: str):
        self.quote_open, self.quote_close, self.null = quote_open, quote_close, null
        self.stack: list[str] = []
        self.in_string = False
        self.held = ""  # part of a quote marker, not yet known to be one
        self.word = ""  # a bare key or value being read
        self.expect_key = False
        self.have_value = False  # the current slot holds a value already (a string, a nested close)
        self.done = self.error = False
        self.rest = ""  # nothing read past the value to give back (kwargs.py's cursor may have some)

    def step(self, ch: str) -> str:
        if self.done or self.error:
            self.error = True
            return ""
        if self.in_string:
            return self._in_string(ch)
        return self._outside(ch)

    def _in_string(self, ch: str) -> str:
        self.held += ch
        if self.quote_close.startswith(self.held):
            if self.held != self.quote_close:
                return ""
            self.held, self.in_string, self.have_value = "", False, True
            return '"'
        out = ""
        # the held text is not the closer: give back its first character, look again at the rest
        while self.held and not self.quote_close.startswith(self.held):
            out += json.dumps(self.held[0], ensure_ascii=False)[1:-1]
            self.held = self.held[1:]
        if self.held == self.quote_close:
            self.held, self.in_string, self.have_value = "", False, True
            out += '"'
        return out

    def _outside(self, ch: str) -> str:
        if self.held or (ch == self.quote_open[0] and not self.word):
            self.held += ch
            if not self.quote_open.startswith(self.held):
                self.error = True
                return ""
            if self.held != self.quote_open:
                return ""
            self.held = ""
            if self.have_value or not self.stack:
                self.error = True
                return ""
            self.in_string = True
            return '"'
        if ch in "{[":
            if self.word or self.have_value or (self.stack and self.expect_key):
                self.error = True
                return ""
            self.stack.append(ch)
            self.expect_key, self.have_value = ch == "{", False
            return ch
        if not self.stack:
            self.error = True
            return ""
        if ch == ":":
            if self.stack[-1] != "{" or not self.expect_key:
                self.error = True
                return ""
            key, self.word = self.word, ""
            if key and not self.have_value and _KEY.fullmatch(key):
                out = json.dumps(key, ensure_ascii=False) + ": "
            elif not key and self.have_value:  # a quoted key
                out = ": "
            else:
                self.error = True
                return ""
            self.expect_key, self.have_value = False, False
            return out
        if ch in ",}]":
            out = self._end_value(closing=ch != ",")
            if self.error:
                return ""
            if ch == ",":
                self.expect_key, self.have_value = self.stack[-1] == "{", False
                return out + ", "
            opened = self.stack.pop()
            if (opened, ch) not in (("{", "}"), ("[", "]")):
                self.error = True
                return ""
            self.expect_key, self.have_value = False, True
            self.done = not self.stack
            return out + ch
        if ch.isspace() or ch in '"\'':
            self.error = True
            return ""
        self.word += ch
        if len(self.word) > 64:
            self.error = True
        return ""

    def _end_value(self, *, closing: bool) -> str:
        """The value that ends at `,` / `}` / `]`: a bare word as JSON; an empty slot only where a container
        closes empty."""
        word, self.word = self.word, ""
        if self.expect_key:  # `{}` closes an empty object; `{a}` or `{a:1,}` is not notation
            if word or not closing or self.have_value:
                self.error = True
            return ""
        if self.have_value:
            if word:
                self.error = True
            return ""
        if not word:
            if not (closing and self.stack and self.stack[-1] == "["):
                self.error = True
            return ""
        if word == self.null:
            return "null"
        if word in ("true", "false") or _NUMBER.fullmatch(word):
            return word
        self.error = True
        return ""
