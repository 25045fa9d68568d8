"""Arguments written as keyword arguments in Python-call notation (`kwargs` formats, format.py), not JSON. LFM2.5:

    [search(query='it's "x"', days=3, metric=True, o={"a": null}, l=['a', None])]   ↔   {"query": "it's \\"x\\"", ...}

Each JSON type is spelled as the template spells it, learned by probing (`kwargs_spelling`): strings raw between
quote markers (unescaped: a string may hold the quote), true / false / null as `constants` says, numbers as JSON,
objects and arrays as JSON or as Python's repr. `write` spells arguments so; a `KwargsCursor` reads them back one
character at a time and gives the JSON text as it goes (the parser streams and stays split-invariant).

A raw string ends at the first closing quote that is followed by what may follow a value and cannot be inside
one: the next `KEY=`, the end of the last call, or `), NAME(` (the next call). The fence (kwargs_grammar.py) lets
a string hold the quote anywhere else, so that what it lets the model write reads back as written.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from itertools import product

IDENT_CHARS = "A-Za-z0-9_.\\-"
_IDENT_START = re.compile(r"[A-Za-z_]")
_IDENT = re.compile(f"[{IDENT_CHARS}]")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WORD = re.compile(r"[A-Za-z0-9_.+\-]")
_KEY_LIMIT, _LITERAL_LIMIT = 64, 1 << 20
WORDS = {"python": ("True", "False", "None"), "": ("true", "false", "null")}


def write(arguments: dict, *, param_mid: str, pair_sep: str, quote_open: str, quote_close: str, constants: str,
          object_literal: str, array_literal: str) -> str:
    """`arguments` (a JSON object) in the notation: the text between the call's parentheses."""
    true, false, null = WORDS[constants]

    def spell(value) -> str:
        if isinstance(value, str):
            return quote_open + value + quote_close
        if isinstance(value, bool):
            return true if value else false
        if value is None:
            return null
        if isinstance(value, (dict, list)):
            literal = object_literal if isinstance(value, dict) else array_literal
            return repr(value) if literal == "python" else json.dumps(value, ensure_ascii=False)
        return json.dumps(value)

    return pair_sep.join(f"{key}{param_mid}{spell(value)}" for key, value in arguments.items())


def spelling_of(fmt) -> dict:
    """The keyword arguments of `write` a format holds."""
    return {name: getattr(fmt, name) for name in ("param_mid", "pair_sep", "quote_open", "quote_close", "constants",
                                                  "object_literal", "array_literal")}


# ---------------------------------------------------------------------------------------------- probing

def kwargs_spelling(written: Callable[[dict], str], key: str, other_key: str, string: str, other: str,
                    number: int) -> dict | None:
    """How a template writes keyword arguments, from `written(arguments)` (its text from the call's name on):
    None when its arguments are not written as KEY=VALUE pairs with quoted strings."""
    with_number, with_string = written({key: number}), written({key: string})
    at = with_number.find(key)
    if at == -1 or with_string.find(key) != at:
        return None
    after_key = with_number[at + len(key):]
    digits = after_key.find(str(number))
    param_mid = after_key[:digits] if digits > 0 else ""
    if not (0 < len(param_mid) <= 3) or any(c.isalnum() or c.isspace() or c in "<>[]{}\"'" for c in param_mid):
        return None
    head = key + param_mid
    if not with_string.startswith(head, at) or string not in with_string[at + len(head):]:
        return None
    quote_open = with_string[at + len(head):with_string.find(string, at + len(head))]
    after_number = with_number[at + len(head) + len(str(number)):]
    after_string = with_string[with_string.find(string, at + len(head)) + len(string):]
    if not quote_open or len(quote_open) > 3 or any(c.isspace() or c.isalnum() for c in quote_open) \
            or not after_string.endswith(after_number) or after_string == after_number:
        return None
    quote_close = after_string[:len(after_string) - len(after_number)]
    pair = written({key: string, other_key: other})
    first = f"{head}{quote_open}{string}{quote_close}"
    if not pair.startswith(first, at) or other_key not in pair[at + len(first):]:
        return None
    pair_sep = pair[at + len(first):pair.find(other_key, at + len(first))]
    if not pair_sep or len(pair_sep) > 3:
        return None
    probe = {key: "zq x", "zqkc": True, "zqkd": False, "zqke": None, "zqkf": 1.5,
             "zqkg": {"zqa": [True, None, "zq y"]}, "zqkh": ["zq z", 2, False, None, {"zqb": "zq w"}]}
    text = written(probe)
    for constants, object_literal, array_literal in product(("python", ""), ("json", "python"), ("json", "python")):
        spelling = {"param_mid": param_mid, "pair_sep": pair_sep, "quote_open": quote_open,
                    "quote_close": quote_close, "constants": constants, "object_literal": object_literal,
                    "array_literal": array_literal}
        if write(probe, **spelling) in text:
            return spelling
    return None


# ---------------------------------------------------------------------------------------------- reading

class KwargsCursor:
    """`step(ch)` → the JSON text that character completes, from the character after the call's opening
    parenthesis (`start()` gives the opening brace) through its closer (`done`); `rest` is what the cursor read
    past the closer (the next call's separator, the section's end), to be read again. `error`: not the notation
    (`rest` then holds what was held before the offending character)."""

    def __init__(self, fmt, *, call_sep: str, section_close: str, name_close: str):
        self.mid, self.sep, self.close = fmt.param_mid, fmt.pair_sep, fmt.call_close
        self.quote_open, self.quote_close = fmt.quote_open, fmt.quote_close
        self.words = dict(zip(WORDS[fmt.constants], ("true", "false", "null")))
        self.literals = {"{": fmt.object_literal, "[": fmt.array_literal}
        # what may follow the closing quote of a string that ends the call (format.py): the last call's end, or
        # the next call's separator, name and opening
        self.ends_section = self.close + section_close
        self.next_call = (self.close + call_sep, name_close) if call_sep else None
        self.state = "first"  # first | key | value | string | word | literal | after
        self.held = ""
        self.key = ""
        self.pairs = 0
        self.literal: _LiteralReader | None = None
        self.done = self.error = False
        self.rest = ""

    def start(self) -> str:
        return "{"

    def step(self, ch: str) -> str:
        if self.done or self.error:
            self.error = True
            return ""
        out = getattr(self, "_" + self.state)(ch)
        if self.error and not self.rest:
            self.rest = self.held
        return out

    # ------------------------------------------------------------------ keys

    def _first(self, ch: str) -> str:
        self.held += ch
        if self.close.startswith(self.held):
            if self.held != self.close:
                return ""
            self.held, self.done = "", True
            return "}"
        held, self.held = self.held, ""
        self.state = "key"
        out = ""
        for c in held:
            out += self._key(c)
        return out

    def _key(self, ch: str) -> str:
        if self.held or (ch == self.mid[0] and self.key):
            self.held += ch
            if not self.mid.startswith(self.held):
                return self._fail()
            if self.held != self.mid:
                return ""
            self.held, self.state = "", "value"
            return self._open_pair()
        if not (_IDENT.fullmatch(ch) if self.key else _IDENT_START.fullmatch(ch)) or len(self.key) >= _KEY_LIMIT:
            return self._fail()
        self.key += ch
        return ""

    def _open_pair(self) -> str:
        head = ("" if not self.pairs else ", ") + json.dumps(self.key, ensure_ascii=False) + ": "
        self.pairs += 1
        self.key = ""
        return head

    # ------------------------------------------------------------------ values

    def _value(self, ch: str) -> str:
        if self.held or ch == self.quote_open[0]:
            self.held += ch
            if not self.quote_open.startswith(self.held):
                return self._fail()
            if self.held != self.quote_open:
                return ""
            self.held, self.state = "", "string"
            return '"'
        if ch in self.literals:
            self.literal, self.state = _LiteralReader(self.literals[ch]), "literal"
            return self._literal(ch)
        if _WORD.fullmatch(ch):
            self.held, self.state = ch, "word"
            return ""
        return self._fail()

    def _word(self, ch: str) -> str:
        if _WORD.fullmatch(ch) and len(self.held) < _KEY_LIMIT:
            self.held += ch
            return ""
        word, self.held = self.held, ""
        if word in self.words:
            value = self.words[word]
        elif _NUMBER.fullmatch(word):
            value = word
        else:
            self.rest = word  # given back with the rest as text
            return self._fail()
        self.state = "after"
        return value + self._after(ch)

    def _literal(self, ch: str) -> str:
        reader = self.literal
        reader.step(ch)
        if reader.error:
            return self._fail()
        if not reader.done:
            return ""
        self.literal, self.state = None, "after"
        return reader.json

    def _after(self, ch: str) -> str:
        """After a value that is not a string: the pair separator or the call's closer."""
        self.held += ch
        if self.held == self.sep:
            self.held, self.state = "", "key"
            return ""
        if self.held == self.close:
            self.held, self.done = "", True
            return "}"
        if self.sep.startswith(self.held) or self.close.startswith(self.held):
            return ""
        return self._fail()

    # ------------------------------------------------------------------ strings

    def _string(self, ch: str) -> str:
        """Inside a raw string; after a closing quote, held until what follows tells whether it ends it."""
        self.held += ch
        out = ""
        while self.held:
            verdict = self._string_end(self.held)
            if verdict == "more":
                return out
            if verdict is not None:
                return out + verdict
            # the held text does not end the string: its first character is the string's
            out += json.dumps(self.held[0], ensure_ascii=False)[1:-1]
            self.held = self.held[1:]
        return out

    def _string_end(self, held: str) -> str | None:
        """The JSON the held text completes where it ends the string ('"' and what follows), "more" while it may
        still, None where it cannot (its first character is the string's)."""
        q = self.quote_close
        if len(held) <= len(q):
            return "more" if q.startswith(held) else None
        if not held.startswith(q):
            return None
        after = held[len(q):]
        verdicts = [self._next_key(after), _literal_match(self.ends_section, after)]
        if self.next_call:
            verdicts.append(_ident_between(self.next_call[0], self.next_call[1], after))
        if "full" in verdicts:
            kind = verdicts.index("full")
            self.held = ""
            if kind == 0:  # the next pair: its key read
                self.key = after[len(self.sep):len(after) - len(self.mid)]
                self.state = "value"
                return '"' + self._open_pair()
            self.rest, self.done = after[len(self.close):], True
            return '"}'
        return "more" if "partial" in verdicts else None

    def _next_key(self, after: str) -> str | None:
        return _ident_between(self.sep, self.mid, after)

    def _fail(self) -> str:
        self.error = True
        return ""


def _literal_match(literal: str, text: str) -> str | None:
    if text == literal:
        return "full"
    return "partial" if literal.startswith(text) else None


def _ident_between(head: str, tail: str, text: str) -> str | None:
    """Whether `text` is head + IDENT + tail ("full"), a beginning of one ("partial"), or neither (None)."""
    if len(text) <= len(head):
        return "partial" if head.startswith(text) else None
    if not text.startswith(head):
        return None
    body = text[len(head):]
    size = 0
    while size < len(body) and size < _KEY_LIMIT and (_IDENT.fullmatch(body[size]) if size else
                                                       _IDENT_START.fullmatch(body[size])):
        size += 1
    if size == len(body):
        return "partial" if size < _KEY_LIMIT else None
    if not size:
        return None
    rest = body[size:]
    if rest == tail:
        return "full"
    return "partial" if tail.startswith(rest) else None


class _LiteralReader:
    """An object or array value, to its closing bracket (strings in either quote, with escapes, skipped over),
    then read as JSON or as a Python literal (`literal`) and given as JSON."""

    def __init__(self, literal: str):
        self.python = literal == "python"
        self.text = ""
        self.depth = 0
        self.quote = ""
        self.escaped = False
        self.done = self.error = False
        self.json = ""

    def step(self, ch: str) -> None:
        self.text += ch
        if len(self.text) > _LITERAL_LIMIT:
            self.error = True
        elif self.quote:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == self.quote:
                self.quote = ""
        elif ch == '"' or (ch == "'" and self.python):
            self.quote = ch
        elif ch in "[{":
            self.depth += 1
        elif ch in "]}":
            self.depth -= 1
            if self.depth == 0:
                self._convert()

    def _convert(self) -> None:
        try:
            value = ast.literal_eval(self.text) if self.python else json.loads(self.text)
            self.json = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            self.error = True
            return
        self.done = True
