"""GLM-4.5's llguidance fence grammar, built from the shared declaration in format.py (tags, value typing).

What the fence lets a GLM model write after `<|assistant|>` (two tools, tool_choice auto, thinking on):

    "\n" <think> reasoning </think>                        optional, only when the request reasons
    free text                                              no markup spelled out in it, nor a bare call's opening
    "\n" {"name": "get_weather", "arguments": {...}}      or (auto) one call as bare JSON (bare_json.py)
    <tool_call> "get_weather\n"                            a known tool's name line
      <arg_key> "city" </arg_key> "\n" <arg_value> raw text </arg_value> "\n"     string: raw, no markup
      <arg_key> "days" </arg_key> "\n" <arg_value> %json{integer} </arg_value> "\n"  (optional: skippable)
    </tool_call>
    "\n" <tool_call> ... </tool_call>                      more calls, one newline apart

Parameters come in schema order, each at most once; required ones cannot be skipped. Every tag is spelled with
`MarkupTokens.lark` (an added token must be named by id; llguidance never matches it from quoted text); text
before a tag that is plain text becomes a lazy lexeme ending at that tag. Free text, reasoning and raw string
values exclude the spelled-out markup (upper-case slips included), because the parser would read it as a tag.
"""

from __future__ import annotations

import json
import re

from zllm.canonical import FunctionTool
from zllm.dialects.bare_json import bare_call_rules, bare_opening_regex
from zllm.dialects.base import (
    CANONICAL_JSON_GUIDANCE,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
)
from zllm.dialects.glm.format import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    NL,
    SPELLINGS,
    THINK_CLOSE,
    THINK_OPEN,
    VALUE_CLOSE,
    VALUE_OPEN,
    is_string_schema,
    param_schemas,
)
from zllm.dialects.string_values import escape_slashes, min_length, raw_string_terminal


def fence_grammar(spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
    """The grammar for one request, None when nothing is constrained (every family's grammar.py has this function)."""
    if not spec.constrains:
        return None
    lark = _LarkWriter(markup)
    calls = spec.choice.mode != "none" and bool(spec.tools)
    answer = _answer_rule(lark, spec, calls)
    start = f"think? {answer}" if spec.thinking else answer
    if spec.thinking:
        lark.rule("think", f'{lark.lits(NL, THINK_OPEN)} {lark.text_until(THINK_CLOSE)}')
    used = (THINK_OPEN, THINK_CLOSE) if spec.thinking else ()
    if calls:
        used += (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)
    return FenceGrammar(lark=lark.text(start), literals=used)


def _answer_rule(lark: _LarkWriter, spec: FenceSpec, calls: bool) -> str:
    """The rule after the reasoning: free text or the response JSON, and/or calls, as the tool choice says."""
    if calls:
        tools = spec.tools if spec.choice.mode != "tool" else tuple(t for t in spec.tools if t.name == spec.choice.name)
        lark.rule("call", " | ".join(_call_rule(lark, index, tool) for index, tool in enumerate(tools)))
        lark.rule("more_calls", f'({lark.lits(NL, CALL_OPEN)} call)*')
    forced_call = f'{lark.lits(NL, CALL_OPEN)} call more_calls'
    if spec.response_schema is not None:
        schema = {**spec.response_schema, "x-guidance": CANONICAL_JSON_GUIDANCE}
        lark.rule("json_answer", f"%json {json.dumps(schema, ensure_ascii=False)}")
    if calls and spec.choice.mode in ("required", "tool"):
        return forced_call
    if spec.response_schema is not None:
        return f'("\\n" json_answer | {forced_call})' if calls else '"\\n" json_answer'
    text = _answer_text(lark, spec.tools)
    if not calls:
        return f"{text}?"
    bare = ""
    if spec.choice.mode == "auto":  # one call written as a bare JSON object after GLM's "\n", the whole answer
        for name, body in bare_call_rules(spec.tools, framing=NL).items():
            lark.rule(name, body)
        bare = " | bare_call"
    return f"({text}?{bare} | {_answer_head(lark, spec.tools)} call more_calls)"


def _answer_text(lark: _LarkWriter, tools: tuple[FunctionTool, ...]) -> str:
    """The answer's free text: no markup, and (tools declared) no opening the way a bare JSON call does, with
    or without GLM's "\n" before it (the parser would read it as a call: bare_json.py)."""
    return lark.terminal("ANSWER_TEXT", _free_text(nonempty=True) + _not_bare(tools))


def _answer_head(lark: _LarkWriter, tools: tuple[FunctionTool, ...]) -> str:
    """The answer's free text, then the first call's opener."""
    if lark.markup.is_single(CALL_OPEN):
        return f"{_answer_text(lark, tools)}? {lark.markup.lark(CALL_OPEN)}"
    any_text = lark.terminal("ANSWER_TEXT_ANY", _free_text(nonempty=False) + _not_bare(tools))
    return lark.rule("answer_head", f"{any_text} {lark.markup.lark(CALL_OPEN)}", lazy=True)


def _not_bare(tools: tuple[FunctionTool, ...]) -> str:
    return f" & ~{bare_opening_regex(tools, framing=chr(92) + 'n?')}" if tools else ""


def _call_rule(lark: _LarkWriter, index: int, tool: FunctionTool) -> str:
    """`call_<i>`: the name line, the parameters, the closer (the opener is written by the caller)."""
    name = f"call_{index}"
    params = _params(lark, index, tool)
    lark.rule(name, " ".join([lark.lits(tool.name + "\n"), *params, lark.lits(CALL_CLOSE)]))
    return name


def _params(lark: _LarkWriter, index: int, tool: FunctionTool) -> list[str]:
    if tool.grammar is not None:
        return [_param_rule(lark, f"p_{index}_0", "input", _free_form_value(lark, tool))]
    schemas = param_schemas(tool)
    if not schemas:
        # no "properties" at all: any keys, raw values; declared-empty or closed: no arguments
        if "properties" in tool.parameters or tool.parameters.get("additionalProperties", True) is False:
            return []
        pair = " ".join([lark.lits(KEY_OPEN), lark.text_until(KEY_CLOSE), lark.lits(NL, VALUE_OPEN),
                         lark.text_until(VALUE_CLOSE), lark.lits(NL)])
        lark.rule(f"p_{index}_any", pair)
        return [f"p_{index}_any*"]
    required = set(tool.parameters.get("required") or ())
    parts = []
    for number, (key, schema) in enumerate(schemas.items()):
        rule = _param_rule(lark, f"p_{index}_{number}", key, _typed_value(lark, tool, schema))
        parts.append(rule if key in required else f"{rule}?")
    return parts


def _param_rule(lark: _LarkWriter, name: str, key: str, value_and_closer: str) -> str:
    lark.rule(name, f'{lark.lits(KEY_OPEN, key, KEY_CLOSE, NL, VALUE_OPEN)} {value_and_closer} {lark.lits(NL)}')
    return name


def _typed_value(lark: _LarkWriter, tool: FunctionTool, schema: dict) -> str:
    """A parameter's value followed by `</arg_value>`."""
    closer = lark.markup.lark(VALUE_CLOSE)
    if is_string_schema(schema):
        choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if choices:
            return f"({' | '.join(lark.lits(c) for c in choices if isinstance(c, str))}) {closer}"
        bounded = raw_string_terminal(schema)
        if bounded is not None:
            return _bounded_value(lark, bounded, min_length(schema))
        return lark.text_until(VALUE_CLOSE)
    return f"%json {json.dumps(_json_schema(tool, schema), ensure_ascii=False)} {closer}"


def _bounded_value(lark: _LarkWriter, bounded: str, low: int) -> str:
    """A raw string under minLength / maxLength / pattern (string_values.py), markup-free, then the closer."""
    index = len(lark._lines)
    if lark.markup.is_single(VALUE_CLOSE):
        name = lark.terminal(f"STRING_{index}", f"{bounded} & {_free_text(nonempty=True)}")
        return f"{name}{'' if low else '?'} {lark.markup.lark(VALUE_CLOSE)}"
    name = lark.terminal(f"STRING_ANY_{index}", f"{bounded} & {_free_text(nonempty=False)}")
    return lark.rule(f"until_string_{index}", f"{name} {lark.markup.lark(VALUE_CLOSE)}", lazy=True)


def _json_schema(tool: FunctionTool, schema: dict) -> dict:
    """The parameter's schema with the canonical JSON spelling forced and the root's definitions carried
    along (a `$ref` into them must still resolve once the schema stands alone)."""
    out = {**schema, "x-guidance": CANONICAL_JSON_GUIDANCE}
    for defs in ("$defs", "definitions"):
        if defs in tool.parameters and defs not in out:
            out[defs] = tool.parameters[defs]
    return out


def _free_form_value(lark: _LarkWriter, tool: FunctionTool) -> str:
    """A free-form tool's `input`: raw text (GLM does not quote strings) that its own grammar accepts, embedded
    as a terminal (regex) or a nested grammar (Lark)."""
    assert tool.grammar is not None
    closer = lark.markup.lark(VALUE_CLOSE)
    if tool.grammar.syntax == "regex":
        return f"/{escape_slashes(tool.grammar.definition)}/ {closer}"
    return f"%lark {{\n{tool.grammar.definition}\n}} {closer}"


# ------------------------------------------------------------------------------------------ lark text


class _LarkWriter:
    """Collects rules and terminals; names each once."""

    def __init__(self, markup: MarkupTokens):
        self.markup = markup
        self._lines: dict[str, str] = {}

    def rule(self, name: str, body: str, *, lazy: bool = False) -> str:
        self._lines.setdefault(name, f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def terminal(self, name: str, body: str) -> str:
        self._lines.setdefault(name, f"{name}: {body}")
        return name

    def lits(self, *texts: str) -> str:
        """Literal texts in sequence, each tag spelled as `MarkupTokens.lark` says. Adjacent plain texts are ONE
        lexeme: llguidance lexes greedily, so free text still matching `\\n<th` would never let a separate
        "\\n" lexeme end there; as one lexeme `"\\n<think>"` competes with the free text and wins at `>`."""
        out: list[str] = []
        plain = ""
        for text in texts:
            if self.markup.is_single(text):
                out += [json.dumps(plain, ensure_ascii=False)] if plain else []
                out.append(self.markup.lark(text))
                plain = ""
            else:
                plain += text
        out += [json.dumps(plain, ensure_ascii=False)] if plain else []
        return " ".join(out)

    def text_until(self, closer: str) -> str:
        """Text with no markup in it, then `closer`: the closer token after an optional text lexeme, or, where
        the closer is plain text, one lazy lexeme that ends at the closer's first occurrence."""
        if self.markup.is_single(closer):
            return f"{self.terminal('TEXT', _free_text(nonempty=True))}? {self.markup.lark(closer)}"
        name = "until_" + ("end_" if closer.startswith("</") else "") + closer.strip("</>")
        body = f"{self.terminal('TEXT_ANY', _free_text(nonempty=False))} {self.markup.lark(closer)}"
        return self.rule(name, body, lazy=True)

    def text(self, start: str) -> str:
        return "\n".join(["%llguidance {}", f"start: {start}", *self._lines.values()]) + "\n"


def _free_text(*, nonempty: bool) -> str:
    """Any text that spells out no markup (nor its slips)."""
    banned = "|".join(escape_slashes(re.escape(tag)) for tag in SPELLINGS)
    return f"/(?s:.{'+' if nonempty else '*'})/ & ~/(?s:.*)({banned})(?s:.*)/"
