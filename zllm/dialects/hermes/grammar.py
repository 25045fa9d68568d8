"""The llguidance fence for Hermes / Qwen output: the same literals the parser scans for, as a Lark grammar.

Tools A and B, tool_choice auto, Qwen vocabulary (`<tool_call>` = 151657, `</tool_call>` = 151658 are single
added tokens, so the grammar names them by id; a quoted literal would only match ordinary text bytes):

    %llguidance {}
    start: answer
    answer: TEXT calls?
    call: <[151657]> call_rest
    call_rest: "\\n" call_json "\\n" <[151658]>
    call_json: tool_0 | tool_1
    // "A"
    tool_0: "{\\"name\\": \\"A\\", \\"arguments\\": " %json {...A's parameters, "x-guidance": {...}} "}"
    // "B"
    tool_1: "{\\"name\\": \\"B\\", \\"arguments\\": " %json {...} "}"
    calls: call ("\\n" call)*
    TEXT: /(?s:.*)/ & ~/(?s:.*)(?i:<\\/?tool_call>)(?s:.*)/

Free text may never spell a tool tag as ordinary text either (the parser would read it as one). Where the
opener is plain text (SmolLM2) free text cannot simply precede it (a greedy TEXT would swallow the opener), so
the text before the first call is a lazy lexeme ending at the opener:

    answer: TEXT | call_head call_rest ("\\n" call)*
    call_head[lazy]: TEXT "<tool_call>"

Bare JSON calls (parse.py): under `auto` (no response schema) the answer may instead be one call written as a
bare JSON object from its opening brace, `{"name": "A", "arguments": {...}}` (or Llama 3's `"parameters"`), and
then nothing; the free text may not open the way such a call does (the parser would read it as one), so TEXT,
which only ever starts the answer, loses that opening:

    answer: bare_call | TEXT calls?
    bare_call: bare_0 | bare_1
    bare_0: "{\\"name\\": \\"A\\", \\"" bare_key "\\": " %json {...} "}"
    bare_key: "arguments" | "parameters"
    TEXT: /(?s:.*)/ & ~/(?s:.*)(?i:<\\/?tool_call>)(?s:.*)/ & ~/\\{[ \\t\\n\\r]*"name"...:...("A"|"B")(?s:.*)/

Modes: `none` is TEXT alone; `auto` is text then calls (or, with a response schema, that JSON or calls);
`required` and `tool` are calls only (to any tool / to the named one), separated by exactly "\\n" as rendered.
With thinking (Qwen3) the output may open with `<think>...</think>\\n\\n`.
"""

from __future__ import annotations

import json

from zllm.canonical import FunctionTool
from zllm.dialects.base import (
    CANONICAL_JSON_GUIDANCE,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
)
from zllm.dialects.hermes.format import CALL_CLOSE, CALL_OPEN, THINK_CLOSE, THINK_OPEN

# canonical spelling, and unknown keywords or formats in client schemas (e.g. "format": "uri-reference")
# ignored rather than failing the whole request
JSON_GUIDANCE = {**CANONICAL_JSON_GUIDANCE, "lenient": True}
ANY = "/(?s:.*)/"
# text that is not a tool tag in any case: the parser tolerates `<TOOL_CALL>`, so the fence never writes one
TEXT_RULE = "TEXT: " + ANY + r" & ~/(?s:.*)(?i:<\/?tool_call>)(?s:.*)/"
CALLS_RULE = 'calls: call ("\\n" call)*'
REASONING_RULE = "REASONING: " + ANY + r" & ~/(?s:.*)<\/think>(?s:.*)/"


def fence_grammar(spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
    """The grammar for one request, None when nothing is constrained (every family's grammar.py has this
    function); with `spec.thinking` the output may open with a reasoning block."""
    if not spec.constrains:
        return None
    thinking = spec.thinking
    tools = callable_tools(spec)
    lines = ["%llguidance {}", "start: think? answer" if thinking else "start: answer"]
    if thinking:
        lines += think_rules(markup)
    lines += answer_rules(spec, tools, markup)
    literals = ((CALL_OPEN, CALL_CLOSE) if tools else ()) + ((THINK_OPEN, THINK_CLOSE) if thinking else ())
    return FenceGrammar(lark="\n".join(lines) + "\n", literals=literals)


def callable_tools(spec: FenceSpec) -> tuple[FunctionTool, ...]:
    if spec.choice.mode == "none":
        return ()
    if spec.choice.mode == "tool":
        chosen = tuple(tool for tool in spec.tools if tool.name == spec.choice.name)
        if not chosen:
            raise ValueError(f"tool_choice names {spec.choice.name!r}, which is not among the tools")
        return chosen
    return spec.tools


def answer_rules(spec: FenceSpec, tools: tuple[FunctionTool, ...], markup: MarkupTokens) -> list[str]:
    schema = spec.response_schema
    if not tools:
        if schema is not None:
            return ["answer: json_answer", json_answer_rule(schema)]
        # `none` with tools declared: the text may not open as a bare call either (the parser would read one)
        return ["answer: TEXT", text_rule_without_bare_calls(spec.tools) if spec.tools else TEXT_RULE]
    calls = call_rules(tools, markup)
    calls.append(CALLS_RULE)
    if spec.choice.mode in ("required", "tool"):
        return ["answer: calls", *calls]
    if schema is not None:
        return ["answer: json_answer | calls", json_answer_rule(schema), *calls]
    bare, text_rule = bare_call_rules(tools), text_rule_without_bare_calls(tools)
    if markup.is_single(CALL_OPEN):  # TEXT cannot match an added token, so it ends where the opener starts
        return ["answer: bare_call | TEXT calls?", *bare, *calls, text_rule]
    calls.pop()  # the first call follows the lazy head instead
    head = f"call_head[lazy]: TEXT {markup.lark(CALL_OPEN)}"
    return ['answer: bare_call | TEXT | call_head call_rest ("\\n" call)*', head, *bare, *calls, text_rule]


def bare_call_rules(tools: tuple[FunctionTool, ...]) -> list[str]:
    """One call as a bare JSON object, the whole answer (parse.py reads it; render.py writes it back)."""
    rules = ["bare_call: " + " | ".join(f"bare_{i}" for i in range(len(tools))),
             'bare_key: "arguments" | "parameters"']
    for i, tool in enumerate(tools):
        head = lark_string('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "')
        rules.append(f'bare_{i}: {head} bare_key "\\": " %json {guided(arguments_schema(tool))} "}}"')
    return rules


def text_rule_without_bare_calls(tools: tuple[FunctionTool, ...]) -> str:
    """TEXT that does not open as a bare call does: `{`, then a first member "name" naming a declared tool."""
    ws = "[ \\t\\n\\r]*"
    names = "|".join(_regex_literal(json.dumps(tool.name, ensure_ascii=False)) for tool in tools)
    return f'{TEXT_RULE} & ~/\\{{{ws}"name"{ws}:{ws}({names})(?s:.*)/'


def _regex_literal(text: str) -> str:
    """`text` as a regex matching itself: ASCII punctuation as \\xHH (safe inside Lark's /.../ too)."""
    return "".join(f"\\x{ord(ch):02x}" if ch.isascii() and not ch.isalnum() else ch for ch in text)


def call_rules(tools: tuple[FunctionTool, ...], markup: MarkupTokens) -> list[str]:
    rules = [
        f"call: {markup.lark(CALL_OPEN)} call_rest",
        f'call_rest: "\\n" call_json "\\n" {markup.lark(CALL_CLOSE)}',
        "call_json: " + " | ".join(f"tool_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        envelope = '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": '
        rules.append(f"// {json.dumps(tool.name, ensure_ascii=False)}")  # escaped: a comment ends at a newline
        rules.append(f'tool_{i}: {lark_string(envelope)} %json {guided(arguments_schema(tool))} "}}"')
    return rules


def arguments_schema(tool: FunctionTool) -> dict:
    if tool.grammar is not None:
        # A free-form tool (Codex apply_patch) takes {"input": text} where the text follows its own Lark or
        # regex grammar. Inside a JSON string that grammar would apply to the escaped form, which llguidance
        # cannot express, so the fence only guarantees a JSON string here; the tool checks its input itself.
        return {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                "additionalProperties": False}
    return tool.parameters or {"type": "object"}


def think_rules(markup: MarkupTokens) -> list[str]:
    if markup.is_single(THINK_OPEN) and markup.is_single(THINK_CLOSE):
        return [f'think: {markup.lark(THINK_OPEN)} REASONING {markup.lark(THINK_CLOSE)} "\\n\\n"', REASONING_RULE]
    # plain-text tags: a lazy lexeme, so the reasoning ends at the first closer
    return ['think: think_block "\\n\\n"',
            f"think_block[lazy]: {lark_string(THINK_OPEN)} {ANY} {lark_string(THINK_CLOSE)}"]


def json_answer_rule(schema: dict) -> str:
    return f"json_answer: %json {guided(schema)}"


def guided(schema: dict) -> str:
    return json.dumps({**schema, "x-guidance": {**schema.get("x-guidance", {}), **JSON_GUIDANCE}})


def lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
