"""What a derived dialect knows about its model's tool calls: the literals around each part of a call.

    {content_lead}{content}{content_sep}{section_open}
      {call_open}NAME{name_close}ARGUMENTS{call_close}      one per call, `call_sep` between calls
    {section_close}

ARGUMENTS is either one JSON object (`json`) in the canonical spelling, or per-parameter markup (`tagged`):

    {param_open}KEY{param_mid}VALUE{param_close}            one per argument; string values raw, others JSON

with `param_close` naming its key where the template writes it so (MiniMax M3's `NS</KEY>`: KEY_SLOT), and
`param_mid` naming the value's type where it does (Kimi K3's `" type="number"<|sep|>`: TYPE_SLOT, `type_words`
the word per JSON type); nested values as JSON, or (`xml_item`) as elements in the same markup, an array's items
named `xml_item` (MiniMax M3, derived/xml_values.py);

or an object in the template's own notation (`notation`, notation.py: Gemma 4's `{city:<|"|>paris<|"|>,days:3}`),
`quote_open` / `quote_close` around its strings, `null_word` for null, keys sorted where the template sorts them;

or keyword arguments in Python-call notation (`kwargs`, kwargs.py: LFM2.5's `NAME(k='v', n=1)`, the parentheses
being `name_close` / `call_close`): KEY{param_mid}VALUE pairs joined by `pair_sep`, strings raw between `quote_open`
/ `quote_close`, true / false / null as `constants` says, objects and arrays as `object_literal` / `array_literal` say.

Reasoning, where the template writes it: `{think_open}REASONING{think_close}` at the start of the turn.
`turn_end` is the text the template closes an assistant turn with (its end-of-turn marker); `call_turn_end` the
one it closes a turn with calls with, where that differs (Gemma 4 ends it with `<|tool_response>`, and the
results follow in the same model turn). `text_after_calls`: the template writes the turn's text after its calls. `gen_in_think`:
the generation prompt itself opens the reasoning block (the model starts inside it). `content_lead`: whitespace the
template writes after the generation prompt before any content or call (Poolside Laguna XS: `</think>` ends the
prompt, the turn goes on `\n`): framing, not text, and the separator before a bare JSON call (bare_json.py).
`text_lead`: what the template opens a turn of text with and a turn of calls does not (Solar Open's `<|content|>`
against `<|tool_calls|>`, functionary v3.2's recipient `all\n` against the call's `NAME\n`): framing, dropped; the
turn's first characters tell text from calls. `text_arguments`: the template takes a call's arguments as JSON text,
not as an object (functionary v3.2 concatenates them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# stand-ins, inside a literal, for what varies per call and is not markup (`slot`): the call's id as the model
# invents it (Mistral's `[CALL_ID]a1B2c3D4e[ARGS]`, Nemo's `, "id": "a1B2c3D4e"}`), or its index (Kimi K2's
# `functions.NAME:0<|tool_call_argument_begin|>`)
ID_SLOT, INDEX_SLOT = "\x00", "\x01"
SLOTS = (ID_SLOT, INDEX_SLOT)
# stand-ins inside a tagged format's parameter literals: the parameter's key (in `param_close`), the value's
# type word (in `param_mid`)
KEY_SLOT, TYPE_SLOT = "\x02", "\x03"
# the call's name written again, inside `name_close` (muse-glimmer's `to=NAME<|message|>...<atem:invoke name="NAME">`)
NAME_SLOT = "\x04"
STRICT_ID = "[A-Za-z0-9]{9}"  # Mistral's templates refuse any other id


@dataclass(frozen=True)
class CallFormat:
    section_open: str
    call_open: str
    name_close: str
    call_close: str
    call_sep: str
    section_close: str
    arguments: str  # "json" | "tagged" | "notation" | "kwargs"
    param_open: str = ""
    param_mid: str = ""
    param_close: str = ""
    content_sep: str = ""
    content_lead: str = ""
    text_lead: str = ""
    text_arguments: bool = False
    think_open: str = ""
    think_close: str = ""
    gen_in_think: bool = False
    turn_end: str = ""
    call_turn_end: str = ""
    text_after_calls: bool = False
    quote_open: str = ""
    quote_close: str = ""
    null_word: str = ""
    sorted_keys: bool = False
    # a tagged string value holding any of `wrap_chars` is written between `wrap_open` and `wrap_close`
    # (MiniCPM5's `<![CDATA[...]]>`), others raw
    # the call's closer as the model's own turn writes it, where the template adds an id to the calls of earlier
    # turns (Apriel 1.5: `}` last, `, "id": "ID"}` once results follow, `call_close`): either reads back
    bare_call_close: str = ""
    wrap_open: str = ""
    wrap_close: str = ""
    wrap_chars: str = ""
    text_with_calls: bool = True  # False: the template drops an assistant's text beside calls
    # ... or the calls beside text (llama.cpp's DeepSeek R1 writes calls only in a turn without text): render.py
    # gives such a turn to the template without its text, so the calls (and the results after them) are written
    calls_drop_text: bool = False
    single_call: bool = False  # the template refuses two calls in a turn (Llama 3.x): the fence allows one
    # how a tagged non-string value is written: "" JSON; "python": true / false / null as `True` / `False` /
    # `None` (Qwen3-Coder's `| string`), objects and arrays as JSON; "python-objects": objects and arrays as
    # Python literals too (Seed-OSS: read back, but the fence lets the model write JSON there, which the next
    # turn's prompt spells otherwise)
    constants: str = ""

    # a turn without reasoning opens with `think_close` alone (MiniMax M3's `</mm:think>`): framing, dropped
    empty_think: bool = False
    # the markup a turn's text is closed with before `turn_end` where the turn has no calls, made of markers the
    # calls use too (Kimi K3's `<|close|>response<|sep|><|close|>message<|sep|>`): framing, dropped
    text_close: str = ""
    # the type word per JSON type ("string", "integer", "number", "boolean", "null", "object", "array") that
    # `param_mid`'s TYPE_SLOT stands for, as (type, word) pairs (Kimi K3: integer and number are both "number")
    type_words: tuple[tuple[str, str], ...] = ()
    # nested objects and arrays written as elements in the parameters' markup, an array's items named so
    xml_item: str = ""
    # the template leaves out a parameter whose value is null (MiniMax M3)
    null_omitted: bool = False

    # a `kwargs` format's pair separator, and how it writes an object / an array value: "json" (`tojson`) or
    # "python" (`| string`: Python's repr, `['a', True]`)
    pair_sep: str = ""
    object_literal: str = ""
    array_literal: str = ""

    # JSON arguments on lines of their own (Command R+'s `tojson(indent=4) | indent(8)`): `json_indent` spaces per
    # level, `json_margin` more before each line after the first (`json_lines` below); 0: one line, canonical
    json_indent: int = 0
    json_margin: int = 0
    # a block the template writes after the last message whatever it is, before the generation prompt (Command R+'s
    # `Action:` instruction): the next turn's prompt moves it after the new messages (round_trip.py says so)
    after_last: str = ""

    # the slot one literal (name_close or call_close) holds, and the ids its template accepts (a regex, or ""
    # for any id)
    slot: str = ""
    id_pattern: str = ""

    @property
    def end_opens_calls(self) -> bool:
        """The turn's end marker opens the calls too (GigaChat 3's `<|message_sep|>` then `\\n\\nfunction
        call<|role_sep|>`): it cannot stop the turn (the model's EOS does); after text it is the text's closing
        framing (`text_close`)."""
        return bool(self.turn_end) and (self.section_open + self.call_open).startswith(self.turn_end)

    @property
    def python_constants(self) -> bool:
        return self.constants.startswith("python")

    @property
    def notation(self) -> bool:
        return self.arguments == "notation"

    @property
    def kwargs(self) -> bool:
        return self.arguments == "kwargs"

    @property
    def tagged(self) -> bool:
        return self.arguments == "tagged"

    @property
    def reasons(self) -> bool:
        return bool(self.think_close)

    @property
    def hermes_json(self) -> bool:
        """Hermes / Qwen's `<tool_call>\n{"name": ..., "arguments": ...}`: the hand-written dialect speaks it."""
        return (not self.tagged and self.call_open.endswith('<tool_call>\n{"name": "')
                and self.name_close == '", "arguments": ')

    def literals(self) -> tuple[str, ...]:
        """Every non-empty literal, for the fence's tokenizer check and the detokenizer."""
        parts = (self.section_open, self.call_open, self.name_close, self.call_close, self.call_sep,
                 self.section_close, self.param_open, self.param_mid, self.param_close, self.think_open,
                 self.think_close, self.quote_open, self.quote_close, self.wrap_open, self.wrap_close,
                 self.bare_call_close, self.text_close, self.text_lead)
        return tuple(dict.fromkeys(piece for p in parts for piece in split_slot(p) if piece))

    def close_of(self, key: str) -> str:
        """The parameter closer after `key`'s value."""
        return self.param_close.replace(KEY_SLOT, key)

    def mid_of(self, kind: str) -> str:
        """The key / value joiner for a value of JSON type `kind` (its type word where the template writes one)."""
        if not self.type_words:
            return self.param_mid
        return self.param_mid.replace(TYPE_SLOT, self.type_word(kind))

    def type_word(self, kind: str) -> str:
        return dict(self.type_words).get(kind, kind)

    def string_word(self) -> str:
        return self.type_word("string")

    def summary(self) -> str:
        """A call of tool NAME with arguments {"K": "V"} as the model writes it."""
        args = (f"{self.param_open}K{self.mid_of('string')}V{self.close_of('K')}" if self.tagged
                else f"{{K:{self.quote_open}V{self.quote_close}}}" if self.notation
                else f"K{self.param_mid}{self.quote_open}V{self.quote_close}" if self.kwargs
                else json_lines({"K": "V"}, self.json_indent, self.json_margin) if self.json_indent else '{"K": "V"}')
        text = f"{self.section_open}{self.call_open}NAME{self.name_close}{args}{self.call_close}{self.section_close}"
        return text.replace(ID_SLOT, "ID").replace(INDEX_SLOT, "0").replace(NAME_SLOT, "NAME")


def split_slot(literal: str) -> tuple[str, str]:
    """`literal` around its slot: (before, after); (literal, "") without one."""
    for slot in (*SLOTS, KEY_SLOT, TYPE_SLOT, NAME_SLOT):
        if slot in literal:
            head, _, tail = literal.partition(slot)
            return head, tail
    return literal, ""


def json_lines(value, indent: int, margin: int) -> str:
    """`value` as JSON on lines of their own: `indent` spaces per level, `margin` more before each line after the
    first (format.py `json_indent`)."""
    return json.dumps(value, ensure_ascii=False, indent=indent).replace("\n", "\n" + " " * margin)
