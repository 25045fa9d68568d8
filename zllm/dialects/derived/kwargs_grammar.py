"""Fence rules for a `kwargs` format (format.py, kwargs.py: LFM2.5's `[NAME(k='v', n=1), NAME2()]`): grammar.py's
`answer` calls `kwargs_calls` for the rules from the first call's name through the section's end.

A string is raw between quotes and may hold the quote, so where it ends is told by what follows it (kwargs.py):
the closing quote and what follows are one lexeme with the string's text — `TEXT', KEY=` (the next parameter),
`TEXT')]` (the last call's end, before its added token), `TEXT'), ` (another call) — and the text spells none of
those endings (a lexeme that could go on past its ending would never end). So the rules run on from a string to
what follows it, and each parameter's rule holds the rest of the call:

    tool_0: "get_weather(" k_open_0
    k_pair_0_0: "city=" k_val_0_0                         the key, then the value and all that follows
    k_val_0_0: "'" (K_S_0_0_1 k_val_0_1 | ...)           K_S_0_0_1: /(paris|rome)/ "', days="
    k_val_0_1: %json{...} k_after_0_1                    a value that is not a string, then `, KEY=` or `)`
    k_end: ")]" <tool_call_end> | "), " call

Keys in schema order, optional ones left out; numbers as JSON, true / false / null as the template's words,
objects and arrays as JSON or as Python literals (strings in them plain: no quote, backslash or control character,
which Python's repr would spell otherwise).
"""

from __future__ import annotations

import json

from zllm.canonical import FunctionTool
from zllm.dialects.base import CANONICAL_JSON_GUIDANCE
from zllm.dialects.derived.kwargs import IDENT_CHARS, WORDS
from zllm.dialects.glm.format import is_string_schema, param_schemas
from zllm.dialects.string_values import raw_string_terminal

_KINDS = ("string", "integer", "number", "boolean", "null", "object", "array")
# a string inside a Python literal that repr writes back as it is: no quote, backslash, control or separator
_PLAIN = r"/[^'\"\\\x00-\x1f\x7f-\xa0\xad\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff]*/"


def kwargs_calls(w, tools: tuple[FunctionTool, ...]) -> str:
    """The rules for the calls after the section's opener; returns the rule that starts them (`call`)."""
    f = w.f
    names = [w.rule(f"tool_{i}", f"{w.lits(tool.name + f.name_close)} k_open_{i}") for i, tool in enumerate(tools)]
    w.rule("call", " | ".join(names))
    ending = [w.lits(f.call_close + f.section_close)]
    if not f.single_call:
        ending.append(f"{w.lits(f.call_close + f.call_sep + f.call_open)} call")
    w.rule("k_end", " | ".join(ending))
    for i, tool in enumerate(tools):
        _Tool(w, i, tool, tools).rules()
    return "call"


class _Tool:
    def __init__(self, w, index: int, tool: FunctionTool, tools: tuple[FunctionTool, ...]):
        self.w, self.f, self.i, self.tools = w, w.f, index, tools
        if tool.grammar is None:
            self.schemas, required = param_schemas(tool), set(tool.parameters.get("required") or ())
        else:
            self.schemas, required = {"input": {"type": "string"}}, {"input"}
        self.keys = list(self.schemas)
        self.needed = [key in required for key in self.keys]

    def rules(self) -> None:
        w, i = self.w, self.i
        w.rule(f"k_open_{i}", " | ".join([f"k_pair_{i}_{j}" for j in self.following(-1)]
                                         + (["k_end"] if self.may_end(-1) else [])))
        for j, key in enumerate(self.keys):
            w.rule(f"k_pair_{i}_{j}", f"{w.lits(key + self.f.param_mid)} k_val_{i}_{j}")
            self.value(j)

    def following(self, j: int) -> list[int]:
        """The parameters that may follow parameter j (-1: the first): the next ones up to the first required."""
        out = []
        for k in range(j + 1, len(self.keys)):
            out.append(k)
            if self.needed[k]:
                break
        return out

    def may_end(self, j: int) -> bool:
        return not any(self.needed[j + 1:])

    def value(self, j: int) -> None:
        w, f, i = self.w, self.f, self.i
        schema = self.schemas[self.keys[j]]
        kinds = _kinds(schema)
        alternatives = []
        if "string" in kinds:
            alternatives.append(f"{w.lits(f.quote_open)} ({' | '.join(self.string_endings(j, schema))})")
        others = [self.scalar(j, kind, schema) for kind in kinds if kind != "string"]
        if others:
            after = [f"{w.lits(f.pair_sep)} k_pair_{i}_{k}" for k in self.following(j)]
            after += ["k_end"] if self.may_end(j) else []
            w.rule(f"k_after_{i}_{j}", " | ".join(after))
            alternatives.append(f"({' | '.join(others)}) k_after_{i}_{j}")
        w.rule(f"k_val_{i}_{j}", " | ".join(alternatives))

    def string_endings(self, j: int, schema: dict) -> list[str]:
        """The string's text, its closing quote and what follows, as one lexeme each way it may end."""
        w, f, i = self.w, self.f, self.i
        content = w.terminal(f"K_TEXT_{i}_{j}", self.content(_only(schema, "string")))
        endings = []
        for k in self.following(j):
            ending = _quoted(f.quote_close + f.pair_sep + self.keys[k] + f.param_mid)
            lexeme = w.terminal(f"K_S_{i}_{j}_{k}", f"{content} {ending}")
            endings.append(f"{lexeme} k_val_{i}_{k}")
        if self.may_end(j):
            section = w.pieces(f.section_close)
            head = section[0] if section and not w.markup.is_single(section[0]) else ""
            lexeme = w.terminal(f"K_E_{i}_{j}", f"{content} {_quoted(f.quote_close + f.call_close + head)}")
            rest = w.lits(f.section_close[len(head):])
            endings.append(f"{lexeme} {rest}".strip())
            if not f.single_call:
                lexeme = w.terminal(f"K_N_{i}_{j}", f"{content} {_quoted(self.next_call())}")
                endings.append(f"{lexeme} call")
        return endings

    def next_call(self) -> str:
        f = self.f
        return f.quote_close + f.call_close + f.call_sep + f.call_open

    def content(self, schema: dict) -> str:
        """The text of a string: none of the endings above inside it (nor an added token's text), an enum's
        choice or within the schema's bounds."""
        from zllm.dialects.derived.grammar import _regex

        f, w = self.f, self.w
        ident = f"[A-Za-z_][{IDENT_CHARS}]*"
        endings = [_regex(f.quote_close + f.pair_sep) + ident + _regex(f.param_mid),
                   _regex(f.quote_close + f.call_close + f.section_close)]
        if not f.single_call:
            endings.append(_regex(self.next_call()))
        body = f"{w.free_text(nonempty=False)} & ~/(?s:.*)(?:{'|'.join(endings)})(?s:.*)/"
        choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if choices and all(isinstance(c, str) for c in choices):
            body += f" & /(?:{'|'.join(_regex(c) for c in choices)})/"
        bounded = raw_string_terminal(schema)
        return f"{body} & {bounded}" if bounded else body

    def scalar(self, j: int, kind: str, schema: dict) -> str:
        """A value that is not a string, as the template writes it."""
        f = self.f
        true, false, null = WORDS[f.constants]
        if kind == "boolean":
            return f'"{true}" | "{false}"'
        if kind == "null":
            return json.dumps(null)
        if kind in ("object", "array") and (f.object_literal if kind == "object" else f.array_literal) == "python":
            return python_value(self.w, f"k_py_{self.i}_{j}", _only(schema, kind))
        return _json(_only(schema, kind))


def python_value(w, name: str, schema: dict) -> str:
    """A value as Python's repr writes it (what a template's `| string` gives): strings plain between `'`,
    True / False / None, numbers as JSON, lists and dicts with `, ` and `: `, dict keys in schema order."""
    if not any(k in schema for k in ("type", "enum", "const", "properties", "items", "anyOf")):
        return _python_any(w)
    alternatives = []
    for number, kind in enumerate(_kinds(schema)):
        part = f"{name}_{number}"
        sub = _only(schema, kind)
        if kind == "string":
            choices = sub.get("enum", [sub["const"]] if "const" in sub else None)
            body = _PLAIN
            if choices and all(isinstance(c, str) for c in choices):
                body += f" & /(?:{'|'.join(_plain_choice(c) for c in choices if _plain_choice(c))})/"
            bounded = raw_string_terminal(sub)
            text = w.terminal(part.upper(), f"{body} & {bounded}" if bounded else body)
            alternatives.append(f"\"'\" {text} \"'\"")
        elif kind == "boolean":
            alternatives.append('"True" | "False"')
        elif kind == "null":
            alternatives.append('"None"')
        elif kind in ("integer", "number"):
            alternatives.append(_json(sub))
        elif kind == "array":
            items = sub.get("items") if isinstance(sub.get("items"), dict) else {}
            item = python_value(w, f"{part}_i", items)
            w.rule(f"{part}_items", f"{item} (\", \" {item})*")
            alternatives.append(f'"[" {part}_items? "]"')
        else:
            alternatives.append(_python_object(w, part, sub))
    return w.rule(name, " | ".join(alternatives))


def _python_any(w) -> str:
    """Any value in Python's repr (unchecked: the schema says nothing), one rule for all."""
    w.terminal("K_PY_TEXT", _PLAIN)
    w.terminal("K_PY_KEY", "/[A-Za-z0-9_.\\-]{1,64}/")
    w.terminal("K_PY_NUMBER", r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,15})?/")
    w.rule("k_py_pair", "\"'\" K_PY_KEY \"': \" k_py_any")
    w.rule("k_py_dict", '"{" (k_py_pair (", " k_py_pair)*)? "}"')
    w.rule("k_py_list", '"[" (k_py_any (", " k_py_any)*)? "]"')
    return w.rule("k_py_any", "\"'\" K_PY_TEXT \"'\" | K_PY_NUMBER | \"True\" | \"False\" | \"None\" | k_py_dict "
                              "| k_py_list")


def _python_object(w, name: str, schema: dict) -> str:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else None
    if not properties:  # any keys, any values
        _python_any(w)
        return "k_py_dict"
    required = set(schema.get("required") or ())
    keys = list(properties)
    pairs = []
    for number, key in enumerate(keys):
        sub = properties[key] if isinstance(properties[key], dict) else {}
        value = python_value(w, f"{name}_p{number}", sub)
        pairs.append(w.rule(f"{name}_k{number}", f"{json.dumps(repr(key) + ': ')} {value}"))

    def after(k: int) -> str:
        alternatives = []
        for j in range(k + 1, len(keys)):
            comma = '", " ' if k >= 0 else ""
            alternatives.append(f"{comma}{pairs[j]} {after(j)}".strip())
            if keys[j] in required:
                break
        if not alternatives:
            return ""
        rule = w.rule(f"{name}_a{k + 1}", " | ".join(alternatives))
        return rule if any(key in required for key in keys[k + 1:]) else f"{rule}?"

    return f'"{{" {after(-1)} "}}"'.replace("  ", " ")


def _plain_choice(choice: str) -> str:
    from zllm.dialects.derived.grammar import _regex

    return _regex(choice) if repr(choice) == f"'{choice}'" else ""


def _kinds(schema: dict) -> list[str]:
    if is_string_schema(schema):
        return ["string"]
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else [k for k in (kind or ()) if isinstance(k, str)]
    return [k for k in kinds if k in _KINDS] or list(_KINDS)


def _only(schema: dict, kind: str) -> dict:
    return {**schema, "type": kind}


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json(schema: dict) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': CANONICAL_JSON_GUIDANCE}, ensure_ascii=False)}"
