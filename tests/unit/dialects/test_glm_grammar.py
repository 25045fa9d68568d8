"""GLM-4.5 fence grammars checked with llguidance itself over the GLM stand-in tokenizer: what the dialect renders
is accepted token by token, what the parser would misread or the request forbids is rejected."""

from __future__ import annotations

import functools

import llguidance
import llguidance.hf
import pytest

from tests.support.glm_models import glm_tokenizer
from zllm.canonical import FunctionTool, Message, ToolCall, ToolChoice, ToolGrammar
from zllm.dialects.base import FenceSpec, MarkupTokens
from zllm.dialects.glm.dialect import Glm45Xml
from zllm.dialects.glm.format import MARKUP
from zllm.dialects.glm.render import render_assistant_turn

DIALECT = Glm45Xml()
WEATHER = FunctionTool("get_weather", "Current weather", {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
                   "units": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"],
})
SEARCH = FunctionTool("search", "Search the web", {
    "type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"$ref": "#/$defs/filters"}},
    "required": ["query", "filters"],
    "$defs": {"filters": {"type": "object", "properties": {"site": {"type": "string"}}, "required": ["site"],
                          "additionalProperties": False}},
})
NOOP = FunctionTool("noop", "", {"type": "object", "properties": {}})
TOOLS = (WEATHER, SEARCH, NOOP)
BY_NAME = {tool.name: tool for tool in TOOLS}


@functools.cache
def ll_tokenizer():
    return llguidance.hf.from_tokenizer(glm_tokenizer())  # ~2 s: once per test session


def single_markup() -> MarkupTokens:
    tokenizer = glm_tokenizer()
    return MarkupTokens({tag: tokenizer.convert_tokens_to_ids(tag) for tag in MARKUP})


def grammar(markup: MarkupTokens | None = None, **spec) -> str:
    fence = DIALECT.fence_grammar(FenceSpec(**{"tools": TOOLS, **spec}), markup or single_markup())
    assert fence is not None
    return fence.lark


def plain_ids(text: str) -> list[int]:
    """`text` as ordinary tokens only: each markup tag spelled in pieces so it never becomes its added token."""
    tokenizer = glm_tokenizer()
    ids: list[int] = []
    while text:
        at, tag = min(((text.find(t), t) for t in MARKUP if t in text), default=(len(text), ""))
        ids += tokenizer.encode(text[:at], add_special_tokens=False) if at else []
        ids += tokenizer.encode(tag[:-1], add_special_tokens=False) + tokenizer.encode(">", add_special_tokens=False) \
            if tag else []
        text = text[at + len(tag):]
    return ids


def accepts(lark: str, text: str | list[int]) -> bool:
    ids = glm_tokenizer().encode(text, add_special_tokens=False) if isinstance(text, str) else text
    matcher = llguidance.LLMatcher(ll_tokenizer(), lark)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def turn(*calls: tuple[str, str], content: str = "", reasoning: str | None = None) -> str:
    message = Message("assistant", content, reasoning=reasoning,
                      tool_calls=tuple(ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(calls)))
    return render_assistant_turn(message, BY_NAME, keep_reasoning=True).removeprefix("\n<think></think>")


PARIS = ("get_weather", '{"city": "Paris", "days": 3}')
SEARCH_CALL = ("search", '{"query": "a <b> & \\"c\\"\\nline", "filters": {"site": "example.com"}}')


# ------------------------------------------------------------------------------------------ modes


@pytest.mark.parametrize("spec", [
    {"choice": ToolChoice("auto")}, {"choice": ToolChoice("none")}, {"choice": ToolChoice("required")},
    {"choice": ToolChoice("tool", "search")}, {"thinking": True}, {"response_schema": {"type": "object"}},
    {"choice": ToolChoice("none"), "response_schema": {"type": "object"}},
])
def test_every_mode_compiles(spec):
    matcher = llguidance.LLMatcher(ll_tokenizer(), grammar(**spec))
    assert not matcher.is_error(), matcher.get_error()


def test_no_tools_no_schema_is_unconstrained():
    assert DIALECT.fence_grammar(FenceSpec(), single_markup()) is None


def test_auto_accepts_text_and_rendered_calls():
    lark = grammar()
    assert accepts(lark, "\nJust an answer, with <b>html</b> and < signs.")
    assert accepts(lark, turn(PARIS))
    assert accepts(lark, turn(PARIS, SEARCH_CALL, ("noop", "{}"), content="Let me look."))
    assert accepts(lark, turn(("get_weather", '{"city": "Oslo", "units": "f"}')))


@pytest.mark.parametrize(("name", "text"), [
    ("unknown tool", "\n<tool_call>delete_all\n</tool_call>"),
    ("duplicate parameter", ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>A</arg_value>\n"
                            "<arg_key>city</arg_key>\n<arg_value>B</arg_value>\n</tool_call>")),
    ("missing required", "\n<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    ("out of schema order", ("\n<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
                            "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>")),
    ("unknown parameter", "\n<tool_call>noop\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"),
    ("wrong type", ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n"
                   "<arg_key>days</arg_key>\n<arg_value>three</arg_value>\n</tool_call>")),
    ("out of enum", ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n"
                    "<arg_key>units</arg_key>\n<arg_value>k</arg_value>\n</tool_call>")),
    ("non-canonical JSON", ("\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>q</arg_value>\n"
                           '<arg_key>filters</arg_key>\n<arg_value>{"site":"x"}</arg_value>\n</tool_call>')),
    ("$ref schema violated", ("\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>q</arg_value>\n"
                             '<arg_key>filters</arg_key>\n<arg_value>{"page": 2}</arg_value>\n</tool_call>')),
    ("text after the calls", f"{turn(PARIS)}\nDone."),
    ("reasoning not requested", "\n<think>hm</think>\nHi"),
])
def test_auto_rejects(name, text):
    assert not accepts(grammar(), text), name


def test_markup_spelled_as_plain_text_is_rejected_where_the_parser_would_read_it():
    lark = grammar()
    assert not accepts(lark, plain_ids("\nSee <tool_call>get_weather\n"))
    assert not accepts(lark, plain_ids("\nSee <TOOL_CALL> here"))
    value_with_closer = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>a</arg_value>b"
    ids = glm_tokenizer().encode(value_with_closer[:value_with_closer.index("a</arg")], add_special_tokens=False)
    assert not accepts(lark, ids + plain_ids("a</arg_value>b"))


def test_none_forbids_calls():
    lark = grammar(choice=ToolChoice("none"))
    assert accepts(lark, "\nNo tools needed.")
    assert not accepts(lark, turn(PARIS))


def test_required_forces_a_call():
    lark = grammar(choice=ToolChoice("required"))
    assert accepts(lark, turn(PARIS))
    assert accepts(lark, turn(("noop", "{}"), SEARCH_CALL))
    assert not accepts(lark, "\nI would rather talk.")
    assert not accepts(lark, turn(PARIS, content="Text first."))


def test_named_tool_only():
    lark = grammar(choice=ToolChoice("tool", "search"))
    assert accepts(lark, turn(SEARCH_CALL))
    assert not accepts(lark, turn(PARIS))


def test_thinking_allows_a_leading_reasoning_block():
    lark = grammar(thinking=True)
    assert accepts(lark, "\n<think>Plan: call it.\n</think>" + turn(PARIS))
    assert accepts(lark, "\n<think></think>\nDirect answer.")
    assert accepts(lark, "\nNo reasoning at all.")
    assert not accepts(lark, "\nAnswer.<think>late</think>")
    assert not accepts(lark, plain_ids("\n<think>one</think> two</think>"))


def test_response_schema_constrains_the_answer():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    lark = grammar(choice=ToolChoice("none"), response_schema=schema)
    assert accepts(lark, '\n{"answer": 4}')
    assert not accepts(lark, '\n{"answer":4}')
    assert not accepts(lark, "\nfour")
    auto = grammar(response_schema=schema, thinking=True)
    assert accepts(auto, '\n<think>math</think>\n{"answer": 4}')
    assert accepts(auto, turn(PARIS))


# ------------------------------------------------------------------------------------------ free-form tools


PATCH = FunctionTool("apply_patch", "Apply a patch", {
    "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
}, grammar=ToolGrammar("lark", 'start: "*** Begin {" LINE+ "} End"\nLINE: /[a-z ]+\\n/'))
RATIO = FunctionTool("ratio", "", {"type": "object", "properties": {"input": {"type": "string"}}},
                     grammar=ToolGrammar("regex", r"[0-9]+/[0-9]+"))


def free_form_call(tool: FunctionTool, value: str) -> str:
    return f"\n<tool_call>{tool.name}\n<arg_key>input</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"


def test_free_form_tool_values_follow_their_own_grammar():
    lark = grammar(tools=(PATCH, RATIO), choice=ToolChoice("required"))
    assert accepts(lark, free_form_call(PATCH, "*** Begin {add line\nmore\n} End"))
    assert not accepts(lark, free_form_call(PATCH, "*** Begin {ADD\n} End"))
    assert accepts(lark, free_form_call(RATIO, "3/4"))
    assert not accepts(lark, free_form_call(RATIO, "3/x"))


# ------------------------------------------------------------------------------------------ plain-text markup


def test_plain_text_markup_uses_lazy_lexemes():
    """Where the tags are not added tokens (MarkupTokens names none), they are quoted text in the grammar."""
    lark = grammar(MarkupTokens(), thinking=True)
    assert "<[" not in lark and "[lazy]" in lark
    assert accepts(lark, plain_ids("\n<think>hm</think>\nLet me look.\n" + turn(PARIS).lstrip("\n")))
    assert accepts(lark, plain_ids(turn(SEARCH_CALL)))
    assert not accepts(lark, plain_ids("\n<tool_call>delete_all\n</tool_call>"))
    assert not accepts(lark, plain_ids("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>a"
                                       "<tool_call></arg_value>\n</tool_call>"))


def test_grammar_names_the_literals_it_relies_on():
    fence = DIALECT.fence_grammar(FenceSpec(tools=TOOLS, thinking=True), single_markup())
    assert fence is not None and set(fence.literals) == set(MARKUP)
    none = DIALECT.fence_grammar(FenceSpec(tools=TOOLS, choice=ToolChoice("none")), single_markup())
    assert none is not None and none.literals == ()
