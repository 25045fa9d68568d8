"""The Hermes / Qwen3 fence, checked with llguidance itself: the grammar compiles, outputs the dialect renders
are accepted token by token to an accepting state, and what the request forbids is rejected. Both with the
Qwen vocabulary (tags are single added tokens, named `<[id]>`) and a SentencePiece one (tags are text)."""

import llguidance
import pytest

from zllm.canonical import FunctionTool, Message, ToolCall, ToolChoice, ToolGrammar
from zllm.dialects.base import FenceSpec, MarkupTokens
from zllm.dialects.hermes.dialect import HermesJson, Qwen3Hermes
from zllm.dialects.hermes.render import assistant_text

A = FunctionTool("A", "needs x", {"type": "object", "properties": {"x": {"type": "integer"}, "tag": {"type": "string"}},
                                  "required": ["x"], "additionalProperties": False})
B = FunctionTool("B")
PATCH = FunctionTool("apply_patch", "free-form", {"type": "object", "properties": {"input": {"type": "string"}}},
                     grammar=ToolGrammar("lark", 'start: "*** Begin Patch" /(.|\\n)*/'))
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
QWEN_MARKUP = MarkupTokens({"<tool_call>": 151657, "</tool_call>": 151658, "<think>": 151667, "</think>": 151668})


def calls(*pairs, text=""):
    """An assistant output as the dialect renders it."""
    return assistant_text(Message("assistant", text, tool_calls=tuple(
        ToolCall(f"c{i}", name, arguments) for i, (name, arguments) in enumerate(pairs))))


A1 = ("A", '{"x": 1}')
A2 = ("A", '{"x": -7, "tag": "é \\"q\\" \\\\ <b>"}')
B0 = ("B", "{}")


@pytest.fixture(params=["qwen", "plain"])
def vocab(request, qwen_ll_tokenizer, llama_ll_tokenizer):
    """(llguidance tokenizer, markup): Qwen with single-token tags, or a vocabulary where tags are text."""
    if request.param == "qwen":
        return qwen_ll_tokenizer, QWEN_MARKUP
    return llama_ll_tokenizer, MarkupTokens()


def matcher(vocab, spec, dialect=HermesJson()):
    ll_tokenizer, markup = vocab
    grammar = dialect.fence_grammar(spec, markup)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar.lark, ll_tokenizer)
    assert (is_error, messages) == (False, []), grammar.lark
    m = llguidance.LLMatcher(ll_tokenizer, grammar.lark)
    assert not m.is_error(), m.get_error()
    return m


def accepts(vocab, spec, text, dialect=HermesJson()):
    """Every token of `text` (tags as their single ids where the vocabulary has them) is allowed and the
    grammar can end there."""
    m = matcher(vocab, spec, dialect)
    tokens = vocab[0].tokenize_str(text, parse_special=True)
    if m.validate_tokens(tokens) != len(tokens):
        return False
    assert m.consume_tokens(tokens)
    return m.is_accepting()


AUTO = FenceSpec(tools=(A, B))


def test_no_tools_and_no_schema_means_no_fence():
    assert HermesJson().fence_grammar(FenceSpec(), MarkupTokens()) is None
    assert Qwen3Hermes().fence_grammar(FenceSpec(thinking=True), QWEN_MARKUP) is None


def test_auto_accepts_text_calls_or_both(vocab):
    assert accepts(vocab, AUTO, "Just an answer.\nWith lines.")
    assert accepts(vocab, AUTO, "")
    assert accepts(vocab, AUTO, calls(A1))
    assert accepts(vocab, AUTO, calls(A2, B0, A1, text="Checking."))


def test_auto_rejects_invalid_calls(vocab):
    assert not accepts(vocab, AUTO, calls(("C", "{}")))  # unknown tool
    assert not accepts(vocab, AUTO, calls(("A", '{"tag": "t"}')))  # missing required key
    assert not accepts(vocab, AUTO, calls(("A", '{"x": 1, "y": 2}')))  # additionalProperties false
    assert not accepts(vocab, AUTO, calls(("A", '{"x": "1"}')))  # wrong type
    assert not accepts(vocab, AUTO, calls(("A", '{"x":1}')).replace('{"x": 1}', '{"x":1}'))  # not canonical
    assert not accepts(vocab, AUTO, calls(A1) + "\nAfterwards.")  # text after the calls
    assert not accepts(vocab, AUTO, calls(A1) + "\n\n" + calls(B0))  # calls are separated by exactly "\n"


def test_free_text_never_spells_a_tag(vocab):
    ll_tokenizer, _ = vocab
    m = matcher(vocab, AUTO)
    almost = ll_tokenizer.greedy_tokenize("Hi <TOOL_CALL")  # ordinary tokens only
    assert m.validate_tokens(almost) == len(almost)
    as_text = ll_tokenizer.greedy_tokenize("Hi <TOOL_CALL>")
    assert m.validate_tokens(as_text) < len(as_text)


def test_a_json_string_may_spell_the_closer_as_text(vocab):
    """Inside a string the model writes `</tool_call>` with ordinary tokens (the added token is no string
    content); the grammar takes it, and the parser reads it as content (test_hermes_parser `escapes`)."""
    ll_tokenizer, _ = vocab
    m = matcher(vocab, AUTO)
    head, tail = calls(("A", '{"x": 1, "tag": "@"}')).split("@")
    tokens = (ll_tokenizer.tokenize_str(head, parse_special=True) + ll_tokenizer.greedy_tokenize("</tool_call>")
              + ll_tokenizer.tokenize_str(tail, parse_special=True))
    assert m.consume_tokens(tokens) and m.is_accepting()


def test_none_allows_text_only(vocab):
    spec = FenceSpec(tools=(A, B), choice=ToolChoice("none"))
    assert accepts(vocab, spec, "No tools for you.")
    assert not accepts(vocab, spec, calls(A1))
    assert not accepts(vocab, spec, "Hi " + calls(B0))


def test_required_allows_calls_only(vocab):
    spec = FenceSpec(tools=(A, B), choice=ToolChoice("required"))
    assert accepts(vocab, spec, calls(B0))
    assert accepts(vocab, spec, calls(A1, B0))
    assert not accepts(vocab, spec, "I would rather talk.")
    assert not accepts(vocab, spec, calls(A1, text="Sure."))
    assert not accepts(vocab, spec, "")


def test_named_tool_allows_calls_to_it_only(vocab):
    spec = FenceSpec(tools=(A, B), choice=ToolChoice("tool", "A"))
    assert accepts(vocab, spec, calls(A1))
    assert accepts(vocab, spec, calls(A1, A2))
    assert not accepts(vocab, spec, calls(B0))
    assert not accepts(vocab, spec, "text")


def test_required_with_one_tool_forces_the_envelope(qwen_ll_tokenizer):
    m = matcher((qwen_ll_tokenizer, QWEN_MARKUP), FenceSpec(tools=(A,), choice=ToolChoice("required")))
    assert m.consume_tokens([151657])  # <tool_call>
    assert m.compute_ff_bytes().startswith(b'\n{"name": "A", "arguments": {"x": ')


def test_response_schema_alone_and_with_tools(vocab):
    alone = FenceSpec(response_schema=ANSWER)
    assert accepts(vocab, alone, '{"ok": true}')
    assert not accepts(vocab, alone, "Sure: {\"ok\": true}")
    assert not accepts(vocab, alone, '{"ok": "yes"}')
    with_tools = FenceSpec(tools=(A,), response_schema=ANSWER)
    assert accepts(vocab, with_tools, '{"ok": false}')
    assert accepts(vocab, with_tools, calls(A1))
    assert not accepts(vocab, with_tools, "free text")


def test_free_form_tool_takes_one_json_string(vocab):
    spec = FenceSpec(tools=(PATCH,), choice=ToolChoice("required"))
    assert accepts(vocab, spec, calls(("apply_patch", '{"input": "*** Begin Patch\\n+x\\n"}')))
    assert not accepts(vocab, spec, calls(("apply_patch", '{"input": 5}')))


def test_qwen3_output_may_open_with_reasoning(vocab):
    spec = FenceSpec(tools=(A, B), thinking=True)
    assert accepts(vocab, spec, "<think>\nShould I? Yes.\n</think>\n\n" + calls(A1), Qwen3Hermes())
    assert accepts(vocab, spec, "<think>\n\n</think>\n\nPlain answer.", Qwen3Hermes())
    assert accepts(vocab, spec, "No thought.", Qwen3Hermes())
    assert not accepts(vocab, spec, "<think>\nhm\n</think>Glued.", Qwen3Hermes())
    required = FenceSpec(tools=(A,), choice=ToolChoice("required"), thinking=True)
    assert accepts(vocab, required, "<think>\nok\n</think>\n\n" + calls(A1), Qwen3Hermes())
    assert not accepts(vocab, required, "<think>\nok\n</think>\n\nText.", Qwen3Hermes())


def test_thinking_is_not_fenced_in_without_the_flag(qwen_ll_tokenizer):
    vocab = (qwen_ll_tokenizer, QWEN_MARKUP)
    assert not accepts(vocab, FenceSpec(tools=(A,)), "<think>\nx\n</think>\n\n" + calls(A1), Qwen3Hermes())
    assert not accepts(vocab, FenceSpec(tools=(A,), thinking=True), "<think>\nx\n</think>\n\n" + calls(A1))


def test_grammar_names_tags_by_token_id_where_they_are_single_tokens():
    spec = FenceSpec(tools=(A,), thinking=True)
    qwen = Qwen3Hermes().fence_grammar(spec, QWEN_MARKUP)
    assert "<[151657]>" in qwen.lark and "<[151668]>" in qwen.lark and '"<tool_call>"' not in qwen.lark
    assert qwen.literals == ("<tool_call>", "</tool_call>", "<think>", "</think>")
    plain = HermesJson().fence_grammar(spec, MarkupTokens())
    assert '"<tool_call>"' in plain.lark and "<[" not in plain.lark and plain.literals == ("<tool_call>", "</tool_call>")


def test_unknown_tool_choice_name_is_refused():
    with pytest.raises(ValueError, match="not among the tools"):
        HermesJson().fence_grammar(FenceSpec(tools=(A,), choice=ToolChoice("tool", "Z")), MarkupTokens())
