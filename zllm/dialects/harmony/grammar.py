"""The llguidance fence for harmony output: every harmony token is one added token, named by id.

Two tools, tool_choice auto, reasoning allowed (ids of o200k_harmony):

    %llguidance {}
    start: analysis? answer
    analysis: <[200005]> "analysis" <[200008]> TEXT <[200007]> <[200006]> "assistant"
    answer: final | preamble? call
    final: <[200005]> "final" <[200008]> TEXT
    preamble: <[200005]> "commentary" <[200008]> TEXT <[200007]> <[200006]> "assistant"
    call: call_0 | call_1
    call_0: (" to=functions.get_weather" <[200005]> "commentary json"
             | <[200005]> "commentary" " to=functions.get_weather " <[200003]> "json") <[200008]> args_0 <[200012]>
    args_0: %json {...get_weather's parameters, canonical spelling forced}
    TEXT: /(?s:.*)/ & ~/(?s:.*)<\\|(start|end|message|channel|constrain|return|call)\\|>(?s:.*)/

- Markers are added tokens, so a text lexeme can never swallow one: the text ends where the marker's token
  comes, no lazy lexeme is needed. TEXT also refuses the markers spelled as ordinary text (the parser would
  read them as markup).
- A call's header may be written as gpt-oss's template writes it (recipient first, `commentary json`, the
  spelling rendered back, so the next prompt continues this output token for token) or as the harmony
  renderer the model was trained on writes it (`<|channel|>commentary to=functions.NAME <|constrain|>json`):
  a real model keeps to its own habit under `auto` rather than be pushed into an answer.
- A call ends with `<|call|>`; an answer ends where the model stops (`<|return|>`, any stop token).
- auto: an answer, or a call after an optional commentary preamble (text, as the renderer writes a calling
  message's text beside its reasoning); required / named: a call (to the named tool); none: an answer.
- Where two literals meet after `<|channel|>` one is never a prefix of another that may follow there
  ("commentary" is its own lexeme, the recipient after it), so the greedy lexer never commits too early. Without
  reasoning (effort "none") the analysis message is left out. A response schema makes the answer `%json`.
"""

from __future__ import annotations

import json

from zllm.canonical import FunctionTool
from zllm.dialects.base import FenceGrammar, FenceSpec, MarkupTokens
from zllm.dialects.harmony.format import (
    ANALYSIS,
    ASSISTANT,
    CALL,
    CHANNEL,
    COMMENTARY,
    CONSTRAIN,
    END,
    FINAL,
    MESSAGE,
    RECIPIENT_PREFIX,
    START,
)
from zllm.dialects.hermes.grammar import arguments_schema, callable_tools, guided

TEXT_RULE = r"TEXT: /(?s:.*)/ & ~/(?s:.*)<\|(start|end|message|channel|constrain|return|call)\|>(?s:.*)/"


def fence_grammar(spec: FenceSpec, markup: MarkupTokens) -> FenceGrammar | None:
    """The grammar for one request, None when nothing is constrained (every family's grammar.py has this)."""
    if not spec.constrains:
        return None
    m = markup.lark
    tools = callable_tools(spec)
    lines = ["%llguidance {}", "start: analysis? answer" if spec.thinking else "start: answer"]
    if spec.thinking:
        lines.append(f'analysis: {m(CHANNEL)} "{ANALYSIS}" {m(MESSAGE)} TEXT {m(END)} {m(START)} "{ASSISTANT}"')
    body = "TEXT" if spec.response_schema is None else f"%json {guided(spec.response_schema)}"
    final = f'final: {m(CHANNEL)} "{FINAL}" {m(MESSAGE)} {body}'
    if not tools:
        lines += ["answer: final", final]
    elif spec.choice.mode in ("required", "tool"):
        lines += ["answer: call", *_call_rules(tools, markup)]
    else:
        preamble = f'preamble: {m(CHANNEL)} "{COMMENTARY}" {m(MESSAGE)} TEXT {m(END)} {m(START)} "{ASSISTANT}"'
        lines += ["answer: final | preamble? call", final, preamble, *_call_rules(tools, markup)]
    lines.append(TEXT_RULE)
    literals = (CHANNEL, MESSAGE, END, START) + ((CALL, CONSTRAIN) if tools else ())
    return FenceGrammar(lark="\n".join(lines) + "\n", literals=literals)


def _call_rules(tools: tuple[FunctionTool, ...], markup: MarkupTokens) -> list[str]:
    m = markup.lark
    rules = ["call: " + " | ".join(f"call_{n}" for n in range(len(tools)))]
    for n, tool in enumerate(tools):
        template_header = f"{_quoted(RECIPIENT_PREFIX + tool.name)} {m(CHANNEL)} \"{COMMENTARY} json\""
        harmony_header = f"{m(CHANNEL)} \"{COMMENTARY}\" {_quoted(f'{RECIPIENT_PREFIX}{tool.name} ')} {m(CONSTRAIN)} \"json\""
        rules.append(f"call_{n}: ({template_header} | {harmony_header}) {m(MESSAGE)} args_{n} {m(CALL)}")
        rules.append(f"args_{n}: %json {guided(arguments_schema(tool))}")
    return rules


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
