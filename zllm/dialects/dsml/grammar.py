"""The llguidance fence for DeepSeek DSML output: reasoning, answer text, call blocks, typed parameters.

For two tools, tool_choice auto, thinking on, on the V3.1 vocabulary (`</think>` one added token, `｜DSML｜` text):

    %llguidance {}
    start: reasoning answer
    reasoning: PLAIN <[128799]>
    answer: PLAIN | PLAIN_END_0 calls
    calls: invoke+ "\\n</｜DSML｜function_calls>"
    invoke: invoke_0 | invoke_1
    param_0_0: "<｜DSML｜parameter name=\\"timezone\\" string=\\"true\\">" VALUE_END_1
    params_0: (param_0_0 "\\n")
    invoke_0: "\\n<｜DSML｜invoke name=\\"get_datetime\\">\\n" params_0 "</｜DSML｜invoke>"
    ...
    PLAIN_END_0: PLAIN "\\n\\n<｜DSML｜function_calls>"
    VALUE_END_1: VALUE "</｜DSML｜parameter>"
    PLAIN: /(?s:.*)/ & ~/(?s:.*)(?:[|｜]DSML[|｜]|<\\/?think>)(?s:.*)/
    VALUE: /(?s:.*)/ & ~/(?s:.*)[|｜]DSML[|｜](?s:.*)/

Why it is shaped so:
- text and values are greedy terminals that cannot contain the markup, each fused with the literal that ends
  it (`PLAIN "\\n\\n<｜DSML｜function_calls>"`), so one lexeme ends exactly where the markup starts; where the
  markup begins with an added token (`</think>`, V4's `｜DSML｜`) the token follows the text by id instead.
- where two literals can start at the same point, they part right where the shorter one ends: llguidance's
  lexer is greedy, so `"\\n"` + `"<｜DSML｜invoke..."` against `"\\n</｜DSML｜function_calls>"` would commit to
  the longer one at `<` and fail at `｜`. Each invoke carries the newline before it; enum values their closer.
- parameters come in schema order, each at most once, required ones always; a string parameter is raw text
  (`string="true"`), anything else `%json` with the canonical spelling forced (`string="false"`), a parameter
  that may be either offers both. The layout (newlines, the blank line before the block) is the renderer's,
  so the fenced output renders back byte for byte.
- auto: free text or calls after it; required / a named tool: the block right away (after the reasoning);
  none: text that cannot open a block. A response schema replaces the free text with `%json`.
Free-form tools (a Lark or regex grammar for their one string) embed it as a sub-grammar: the result is then
the JSON form `{"grammars": [{"name": "dsml", "lark_grammar": ...}, {"name": "tool_N_input", ...}]}`.
"""

from __future__ import annotations

import json
import re

from zllm.canonical import FunctionTool
from zllm.dialects.base import (
    CANONICAL_JSON_GUIDANCE,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
)
from zllm.dialects.dsml.format import (
    BLOCK_SEPARATOR,
    DSML,
    THINK_CLOSE,
    THINK_OPEN,
    DsmlTags,
    invoke_tag,
    param_tag,
    schema_says_string,
)
from zllm.dialects.dsml.render import DsmlFamily
from zllm.dialects.string_values import escape_slashes, raw_string_terminal

# text that cannot contain DSML markup (either marker spelling) or a think tag; a value only avoids DSML
PLAIN = r"PLAIN: /(?s:.*)/ & ~/(?s:.*)(?:[|｜]DSML[|｜]|<\/?think>)(?s:.*)/"
VALUE = r"VALUE: /(?s:.*)/ & ~/(?s:.*)[|｜]DSML[|｜](?s:.*)/"
PARAM_NAME = r'PARAM_NAME: /[^"<>\n]+/'
TOP_RULES = ("start", "reasoning", "answer", "calls", "invoke")
NON_STRING_TYPES = ["number", "integer", "boolean", "array", "object", "null"]
# the rest of a parameter tag after its name's closing quote
STRING_TRUE, STRING_FALSE = ' string="true">', ' string="false">'


def fence_grammar(spec: FenceSpec, markup: MarkupTokens, *, family: DsmlFamily) -> FenceGrammar | None:
    """The grammar for one request, None when nothing is constrained (every family's grammar.py has this
    function; `family`, V3.2 or V4, is this family's variant)."""
    if not spec.constrains:
        return None
    builder = _Builder(family.tags, markup)
    builder.build(spec)
    literals = tuple(x for x in (THINK_CLOSE if spec.thinking else None, DSML) if x is not None)
    return FenceGrammar(builder.text(), literals)


class _Builder:
    def __init__(self, tags: DsmlTags, markup: MarkupTokens):
        self.tags = tags
        self.markup = markup
        self.rules: dict[str, str] = {}
        self.terminals: dict[tuple[str, str], str] = {}  # (text terminal, literal it runs up to) → name
        self.subgrammars: list[dict] = []
        self.bounded: dict[str, str] = {}  # constrained string value terminals: name → definition

    def text(self) -> str:
        # top-down: the shape first, then tools in order, then the terminals
        names = [n for n in TOP_RULES if n in self.rules] + [n for n in self.rules if n not in TOP_RULES]
        ends = [f"{name}: {body} {json.dumps(head, ensure_ascii=False)}" for (body, head), name in self.terminals.items()]
        rules = [f"{name}: {self.rules[name]}" for name in names]
        used = " ".join(rules + ends)
        bases = [t for t in (PLAIN, VALUE, PARAM_NAME) if re.search(rf"\b{t.split(':')[0]}\b", used)]
        lark = "\n".join(["%llguidance {}", *rules, *ends, *bases, *self.bounded.values()]) + "\n"
        if not self.subgrammars:
            return lark
        return json.dumps({"grammars": [{"name": "dsml", "lark_grammar": lark}, *self.subgrammars]})

    def rule(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    # ------------------------------------------------------------------------------------------ literals

    def spell(self, literal: str) -> str:
        """A literal as a Lark sequence: text quoted, markup that is one added token named by id."""
        parts, rest = [], literal
        while rest:
            at, single = self._first_single(rest)
            if at:
                parts.append(json.dumps(rest[:at], ensure_ascii=False))
            if single is None:
                break
            parts.append(self.markup.lark(single))
            rest = rest[at + len(single):]
        return " ".join(parts)

    def until(self, body: str, literal: str) -> str:
        """`body` text, then `literal`. The text and the literal's leading plain part are one greedy terminal
        (the text cannot contain the literal, so the terminal ends exactly at it); an added token after
        that follows by id."""
        at, _ = self._first_single(literal)
        head, tail = literal[:at], self.spell(literal[at:])
        if not head:
            return f"{body} {tail}"
        name = self.terminals.setdefault((body, head), f"{body}_END_{len(self.terminals)}")
        return f"{name} {tail}".strip()

    def _first_single(self, text: str) -> tuple[int, str | None]:
        """Where the first markup spelled as one added token starts in `text`, and which (None: nowhere)."""
        found = [(text.find(s), s) for s in (DSML, THINK_OPEN, THINK_CLOSE) if self.markup.is_single(s) and s in text]
        return min(found) if found else (len(text), None)

    # --------------------------------------------------------------------------------------------- shape

    def build(self, spec: FenceSpec) -> None:
        self.rule("start", "reasoning answer" if spec.thinking else "answer")
        if spec.thinking:
            self.rule("reasoning", self.until("PLAIN", THINK_CLOSE))
        text = self._answer_text(spec.response_schema)
        mode, tools = spec.choice.mode, self._callable(spec)
        if mode == "none" or not tools:
            self.rule("answer", text)
            return
        opener = BLOCK_SEPARATOR + self.tags.block_open
        if mode == "auto":
            after_text = self.until("PLAIN", opener) if spec.response_schema is None else self.spell(opener)
            self.rule("answer", f"{text} | {after_text} calls")
        else:
            self.rule("answer", f"{self.spell(opener)} calls")
        self.rule("calls", f"invoke+ {self.spell(chr(10) + self.tags.block_close)}")
        self.rule("invoke", " | ".join(self._invoke(n, tool) for n, tool in tools))

    def _answer_text(self, schema: dict | None) -> str:
        return "PLAIN" if schema is None else f"%json {json.dumps(_canonical_json(schema))}"

    @staticmethod
    def _callable(spec: FenceSpec) -> list[tuple[int, FunctionTool]]:
        tools = list(enumerate(spec.tools))
        if spec.choice.mode == "tool":
            tools = [(n, t) for n, t in tools if t.name == spec.choice.name]
            if not tools:
                raise ValueError(f"tool_choice names unknown tool {spec.choice.name!r}")
        return tools

    def _invoke(self, n: int, tool: FunctionTool) -> str:
        params = self._freeform_params(n, tool) if tool.grammar is not None else self._params(n, tool.parameters)
        # each invoke starts with the newline before it: `\n<｜DSML｜invoke` and the block's `\n</｜DSML｜...`
        # then differ at their third character, so no literal is a prefix of another one the lexer weighs
        head = self.spell(f"\n{invoke_tag(self.tags, tool.name)}\n")
        body = f"{head} {params} {self.spell(self.tags.invoke_close)}"
        return self.rule(f"invoke_{n}", body)

    # ---------------------------------------------------------------------------------------- parameters

    def _params(self, n: int, schema: dict) -> str:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not properties:
            if isinstance(schema, dict) and schema.get("additionalProperties") is False:
                return self.rule(f"params_{n}", '"\\n"')
            return self.rule(f"params_{n}", f'"\\n" | ({self._any_param(n)} "\\n")+')
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        required = set(schema.get("required") or ())
        items = [(self._param(n, m, name, {**sub, **defs} if isinstance(sub, dict) else {}), name in required)
                 for m, (name, sub) in enumerate(properties.items())]
        if any(is_required for _, is_required in items):
            body = " ".join(f'({p} "\\n")' + ("" if is_required else "?") for p, is_required in items)
            return self.rule(f"params_{n}", body)
        return self.rule(f"params_{n}", f'"\\n" | {self._some_of(n, [p for p, _ in items])}')

    def _some_of(self, n: int, params: list[str]) -> str:
        """At least one of optional `params`, in order: the first present one, then any of the rest."""
        name = f"some_{n}_{len(params)}"
        rest = " ".join(f'({p} "\\n")?' for p in params[1:])
        alternatives = [f'{params[0]} "\\n" {rest}'.strip()]
        if len(params) > 1:
            alternatives.append(self._some_of(n, params[1:]))
        return self.rule(name, " | ".join(alternatives))

    def _param(self, n: int, m: int, name: str, schema: dict) -> str:
        says_string = schema_says_string(_resolved(schema))
        alternatives = []
        if says_string is not False:
            alternatives.append(f"{self.spell(param_tag(self.tags, name, True))} {self._string_value(schema)}")
        if says_string is not True:
            json_schema = _canonical_json(_without_strings(schema) if says_string is None else schema)
            alternatives.append(f"{self.spell(param_tag(self.tags, name, False))} %json {json.dumps(json_schema)} "
                                f"{self.spell(self.tags.param_close)}")
        return self.rule(f"param_{n}_{m}", " | ".join(alternatives))

    def _string_value(self, schema: dict) -> str:
        choices = schema.get("enum") if "enum" in schema else [schema["const"]] if "const" in schema else None
        if choices and all(isinstance(c, str) for c in choices):
            # each choice fused with the closer, so "a" and "ab" are never a prefix pair
            return "(" + " | ".join(f"({self.spell(c + self.tags.param_close)})" for c in choices) + ")"
        bounded = raw_string_terminal(schema)
        if bounded is not None:  # minLength / maxLength / pattern: a value terminal of its own
            name = f"VALUE_{len(self.bounded)}"
            self.bounded.setdefault(name, f"{name}: {bounded} & {VALUE.split(': ', 1)[1]}")
            return self.until(name, self.tags.param_close)
        return self.until("VALUE", self.tags.param_close)

    def _any_param(self, n: int) -> str:
        """A parameter of a tool whose schema names none: any name, a raw or a JSON value."""
        head, close = self.spell(self.tags.param_open), self.spell(self.tags.param_close)
        any_json = json.dumps(_canonical_json({"type": NON_STRING_TYPES}))
        string = f'{head} PARAM_NAME {self.spell(chr(34) + STRING_TRUE)} {self.until("VALUE", self.tags.param_close)}'
        other = f'{head} PARAM_NAME {self.spell(chr(34) + STRING_FALSE)} %json {any_json} {close}'
        return self.rule(f"any_param_{n}", f"{string} | {other}")

    def _freeform_params(self, n: int, tool: FunctionTool) -> str:
        """A free-form tool takes one string, `input`, whose text follows the tool's own grammar."""
        name = f"tool_{n}_input"
        definition = tool.grammar.definition
        lark = definition if tool.grammar.syntax == "lark" else f"start: /{escape_slashes(definition)}/"
        self.subgrammars.append({"name": name, "lark_grammar": lark})
        tag = self.spell(param_tag(self.tags, "input", True))
        return self.rule(f"params_{n}", f'{tag} @{name} {self.spell(self.tags.param_close + chr(10))}')


def _canonical_json(schema: dict) -> dict:
    return {**schema, "x-guidance": CANONICAL_JSON_GUIDANCE}


def _resolved(schema: dict) -> dict:
    """The schema a local `$ref` points at (in the `$defs` carried along), to decide the value's type."""
    ref, target = schema.get("$ref"), schema
    if not (isinstance(ref, str) and ref.startswith("#/")):
        return schema
    for part in ref[2:].split("/"):
        target = target.get(part) if isinstance(target, dict) else None
    return target if isinstance(target, dict) else schema


def _without_strings(schema: dict) -> dict:
    """The non-string part of a schema that admits strings and more (a string goes the `string="true"` way,
    so the two spellings of one value never compete)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        return {**schema, "type": [k for k in kind if k != "string"]}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return {**schema, key: [b for b in schema[key] if schema_says_string(b) is not True]}
    return {**schema, "type": NON_STRING_TYPES}
