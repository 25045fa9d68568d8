"""The DSML fence, checked with llguidance over the real V3.1 and V4 vocabularies: what the renderer writes for
a well-formed turn is accepted token by token; unknown tools, duplicate / missing / misordered parameters,
wrong typing and calls where none are allowed are refused."""

from __future__ import annotations

import functools

import llguidance
import llguidance.hf
import pytest

from tests.support.deepseek_models import deepseek_v31_tokenizer, v4_tokenizer_or_skip
from zllm.canonical import FunctionTool, Message, ToolCall, ToolChoice, ToolGrammar
from zllm.dialects.base import FenceSpec, MarkupTokens
from zllm.dialects.dsml.dialect import DeepSeekV4Dsml, DeepSeekV32Dsml
from zllm.dialects.dsml.render import assistant_output

WEATHER = FunctionTool("get_weather", "", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]})
PING = FunctionTool("ping", "", {"type": "object", "properties": {}})
CONFIGURE = FunctionTool("configure", "", {"type": "object", "properties": {
    "mode": {"enum": ["fast", "safe"]}, "tags": {"type": "array", "items": {"type": "string"}},
    "note": {"type": ["string", "null"]}, "options": {"$ref": "#/$defs/options"}},
    "$defs": {"options": {"type": "object", "properties": {"depth": {"type": "integer"}}}}})
PATCH = FunctionTool("apply_patch", "", {"type": "object", "properties": {"input": {"type": "string"}}},
                     grammar=ToolGrammar("lark", 'start: "*** Begin\\n" /[a-z ]+/ "\\n*** End"'))
RATIO = FunctionTool("ratio", "", {"type": "object", "properties": {"input": {"type": "string"}}},
                     grammar=ToolGrammar("regex", r"[0-9]+/[0-9]+"))
TOOLS = (WEATHER, PING, CONFIGURE, PATCH, RATIO)


@functools.cache
def ll_tokenizer(tokenizer):
    return llguidance.hf.from_tokenizer(tokenizer)


@pytest.fixture(params=["v3.2", "v4"], scope="module")
def flavour(request):
    if request.param == "v3.2":
        return DeepSeekV32Dsml(), deepseek_v31_tokenizer()
    return DeepSeekV4Dsml(), v4_tokenizer_or_skip()


def markup_tokens(dialect, tokenizer) -> MarkupTokens:
    """What the fence derives from the tokenizer: which markup literals are one added token."""
    added = set(tokenizer.added_tokens_decoder)
    single = {}
    for literal in dialect.markup:
        ids = tokenizer.encode(literal, add_special_tokens=False)
        if len(ids) == 1 and ids[0] in added:
            single[literal] = ids[0]
    return MarkupTokens(single)


def matcher(flavour, spec: FenceSpec) -> llguidance.LLMatcher:
    dialect, tokenizer = flavour
    grammar = dialect.fence_grammar(spec, markup_tokens(dialect, tokenizer))
    found = llguidance.LLMatcher(ll_tokenizer(tokenizer), grammar.lark, log_level=0)
    assert not found.is_error(), found.get_error()
    return found


def accepts(flavour, spec: FenceSpec, text: str) -> bool:
    """The whole text, token by token as the tokenizer cuts it, then EOS."""
    _, tokenizer = flavour
    found = matcher(flavour, spec)
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    return all(found.consume_token(token) for token in ids)


def output(flavour, content: str = "", *calls: tuple[str, str], reasoning: str | None = None) -> str:
    dialect, _ = flavour
    message = Message("assistant", content, tuple(ToolCall(f"c{n}", name, args) for n, (name, args) in enumerate(calls)),
                      reasoning=reasoning)
    return assistant_output(dialect.family, message, with_reasoning=reasoning is not None)


def spec(mode: str = "auto", name: str | None = None, *, thinking: bool = True, schema: dict | None = None):
    return FenceSpec(TOOLS, ToolChoice(mode, name), thinking=thinking, response_schema=schema)


PARIS = ("get_weather", '{"city": "Paris", "days": 3}')


def test_single_token_markup_is_named_by_id(flavour) -> None:
    dialect, tokenizer = flavour
    markup = markup_tokens(dialect, tokenizer)
    assert markup.is_single("</think>")
    assert markup.is_single("｜DSML｜") == isinstance(dialect, DeepSeekV4Dsml)
    assert set(dialect.single_token_markup) <= set(markup.single)


@pytest.mark.parametrize("mode,name", [("auto", None), ("required", None), ("tool", "configure"), ("none", None)])
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("schema", [None, {"type": "object", "properties": {"answer": {"type": "integer"}}}])
def test_grammar_compiles_for_every_choice(flavour, mode, name, thinking, schema) -> None:
    matcher(flavour, spec(mode, name, thinking=thinking, schema=schema))


def test_no_tools_no_schema_is_unconstrained(flavour) -> None:
    dialect, tokenizer = flavour
    assert dialect.fence_grammar(FenceSpec(thinking=True), markup_tokens(dialect, tokenizer)) is None


@pytest.mark.parametrize("turn", [
    ("Plain answer, with < and > and a\n\nblank line.", [], "Think."),
    ("Let me check.", [PARIS], "Need weather."),
    ("", [PARIS, ("ping", "{}"), ("get_weather", '{"city": "Rome"}')], ""),
    ("", [("configure", '{"mode": "safe", "tags": ["a", "b"], "note": null, "options": {"depth": 2}}')], "r"),
    ("", [("configure", '{"note": "free <text> here"}'), ("configure", "{}")], "r"),
    ("", [("apply_patch", '{"input": "*** Begin\\nadd a line\\n*** End"}'), ("ratio", '{"input": "12/34"}')], "r"),
    ("", [("get_weather", '{"city": "São Paulo </b> \\"quoted\\"\\nline two"}')], "r"),
])
def test_rendered_turns_are_accepted_in_auto(flavour, turn) -> None:
    content, calls, reasoning = turn
    text = output(flavour, content, *calls, reasoning=reasoning)
    assert accepts(flavour, spec("auto"), text), text


@pytest.mark.parametrize("bad", [
    ("get_wether", '{"city": "Paris"}'),                    # unknown tool
    ("get_weather", '{"days": 3}'),                         # required parameter missing
    ("get_weather", '{"days": 3, "city": "Paris"}'),        # out of schema order
    ("get_weather", '{"city": "Paris", "days": "3"}'),      # a string where an integer is due
    ("get_weather", '{"city": "Paris", "days": 0}'),        # the schema's minimum
    ("get_weather", '{"city": "Paris", "unit": "C"}'),      # not in the schema
    ("configure", '{"mode": "slow"}'),                      # not in the enum
    ("apply_patch", '{"input": "no markers"}'),             # free-form input off its grammar
    ("ratio", '{"input": "12:34"}'),                        # same, a regex grammar
    ("configure", '{"options": "deep"}'),                   # a string where the $ref'd object is due
])
def test_invalid_calls_are_refused(flavour, bad) -> None:
    assert not accepts(flavour, spec("auto"), output(flavour, "", bad, reasoning="r"))


def test_a_parameter_twice_is_refused(flavour) -> None:
    text = output(flavour, "", PARIS, reasoning="r")
    line = next(part for part in text.split("\n") if 'name="city"' in part)
    assert not accepts(flavour, spec("auto"), text.replace(line, f"{line}\n{line}"))


def test_json_values_must_use_the_canonical_spelling(flavour) -> None:
    text = output(flavour, "", ("configure", '{"tags": ["a", "b"]}'), reasoning="r")
    assert accepts(flavour, spec("auto"), text)
    assert not accepts(flavour, spec("auto"), text.replace('["a", "b"]', '["a","b"]'))


def test_the_block_needs_its_blank_line_and_nothing_after_it(flavour) -> None:
    text = output(flavour, "Checking.", PARIS, reasoning="r")
    assert not accepts(flavour, spec("auto"), text.replace("Checking.\n\n", "Checking."))
    assert not accepts(flavour, spec("auto"), text + "\nDone.")


def test_reasoning_must_close_before_the_answer(flavour) -> None:
    assert not accepts(flavour, spec("auto"), "no closing tag, just text")
    assert accepts(flavour, spec("auto", thinking=False), "no reasoning, just text")
    assert not accepts(flavour, spec("auto", thinking=False), output(flavour, "x", reasoning="r"))


def test_required_means_calls_right_away(flavour) -> None:
    assert accepts(flavour, spec("required"), output(flavour, "", PARIS, reasoning="r"))
    assert not accepts(flavour, spec("required"), output(flavour, "Sure.", PARIS, reasoning="r"))
    assert not accepts(flavour, spec("required"), output(flavour, "Just text.", reasoning="r"))


def test_a_named_tool_allows_only_that_tool(flavour) -> None:
    assert accepts(flavour, spec("tool", "ping"), output(flavour, "", ("ping", "{}"), reasoning="r"))
    assert not accepts(flavour, spec("tool", "ping"), output(flavour, "", PARIS, reasoning="r"))


def test_none_refuses_calls_but_not_text(flavour) -> None:
    assert accepts(flavour, spec("none"), output(flavour, "An answer.", reasoning="r"))
    assert not accepts(flavour, spec("none"), output(flavour, "", PARIS, reasoning="r"))


def test_a_response_schema_constrains_the_answer_text(flavour) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    assert accepts(flavour, spec("auto", schema=schema), output(flavour, '{"answer": 42}', reasoning="r"))
    assert not accepts(flavour, spec("auto", schema=schema), output(flavour, "42", reasoning="r"))
    assert accepts(flavour, spec("auto", schema=schema), output(flavour, "", PARIS, reasoning="r"))


def test_free_form_tools_make_a_grammar_list(flavour) -> None:
    dialect, tokenizer = flavour
    grammar = dialect.fence_grammar(spec("auto"), markup_tokens(dialect, tokenizer))
    assert grammar.lark.startswith('{"grammars": [{"name": "dsml"')
    without = dialect.fence_grammar(FenceSpec((WEATHER,), thinking=True), markup_tokens(dialect, tokenizer))
    assert without.lark.startswith("%llguidance {}\nstart: reasoning answer\n")


def test_the_runtime_fence_accepts_the_dialect(flavour) -> None:
    """The runtime's own checks (zllm/runtime/fence_vocab.py) pass this dialect's markup and grammar (V4's
    `｜DSML｜` is an added token llguidance does not call special: it is still named by id)."""
    from zllm.runtime.fence_vocab import FenceVocab

    dialect, tokenizer = flavour
    vocab = FenceVocab.build(tokenizer, vocab_size=len(tokenizer), stop_token_ids=frozenset({tokenizer.eos_token_id}))
    markup = vocab.markup_tokens(dialect)
    assert markup.single == markup_tokens(dialect, tokenizer).single
    vocab.check_grammar(dialect.fence_grammar(spec("auto"), markup))
