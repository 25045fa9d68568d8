"""Bare JSON calls (issue 21 item 4): a Hermes turn that opens with `{"name": DECLARED, "arguments": {...}}` is a
call: parsed split-invariantly, rendered back as written (the id carries the form), fenced from the opening brace
under `auto`; an object that names no declared tool, or does not open with its name, stays text."""

import pytest

from zllm.canonical import (
    FunctionTool,
    Message,
    TextDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from zllm.dialects.base import FenceSpec
from zllm.dialects.hermes.dialect import HermesJson, Qwen3Hermes
from zllm.dialects.hermes.render import assistant_text
from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
from tests.unit.dialects.test_hermes_grammar import A, B, accepts, vocab  # noqa: F401  (vocab: a fixture)

BASH = FunctionTool("Bash", "run a command", {"type": "object", "properties": {"command": {"type": "string"}}})
TOOLS = (BASH, FunctionTool("Read"))


def parser(dialect=HermesJson(), thinking=False, tools=TOOLS):
    return lambda: dialect.parser(tools, thinking=thinking, new_call_id=counter())


@pytest.mark.parametrize("key, form", [("arguments", "bja"), ("parameters", "bjp")])
def test_a_bare_object_naming_a_declared_tool_is_a_call(qwen_tokenizer, key, form):
    text = '{"name": "Bash", "%s": {"command": "ls -la \\"x\\""}}' % key
    events = assert_split_invariant(parser(), text, tokenizer=qwen_tokenizer)
    args = '{"command": "ls -la \\"x\\""}'
    assert events == [ToolCallStart(0, f"call_0-{form}", "Bash"), ToolCallArgsDelta(0, args), ToolCallEnd(0, args)]


def test_the_call_renders_back_byte_for_byte():
    for key in ("arguments", "parameters"):
        text = '{"name": "Bash", "%s": {"command": "ls"}}' % key
        events = parse_all(parser(), text)
        call = ToolCall(events[0].id, events[0].name, events[-1].arguments)
        assert assistant_text(Message("assistant", "", tool_calls=(call,))) == text
        # the form survives Anthropic's spelling of the id (api/call_ids.py keeps the part after "_")
        renamed = ToolCall("toolu_" + call.id.partition("_")[2], call.name, call.arguments)
        assert assistant_text(Message("assistant", "", tool_calls=(renamed,))) == text


def test_after_reasoning_the_answer_may_open_bare(qwen_tokenizer):
    text = '<think>\nhmm\n</think>\n\n{"name": "Read", "arguments": {}}'
    events = assert_split_invariant(parser(Qwen3Hermes(), thinking=True), text, tokenizer=qwen_tokenizer)
    assert [type(e).__name__ for e in events] == ["ReasoningDelta", "ToolCallStart", "ToolCallArgsDelta",
                                                 "ToolCallEnd"]
    call = ToolCall(events[1].id, "Read", events[-1].arguments)
    block = "<think>\nhmm\n</think>\n\n"
    assert block + assistant_text(Message("assistant", "", tool_calls=(call,))) == text


@pytest.mark.parametrize("text", [
    '{"name": "Paris", "arguments": {}}',  # names no declared tool
    '{"city": "Paris", "name": "Bash"}',  # does not open with its name
    '{"name": 3}',
    '{}',
    '{"name": "Bas',  # cut off before the name is known
    ' {"name": "Bash", "arguments": {}}',  # does not open the turn
    'Sure: {"name": "Bash", "arguments": {}}',
])
def test_other_json_answers_stay_text(qwen_tokenizer, text):
    assert assert_split_invariant(parser(), text, tokenizer=qwen_tokenizer) == [TextDelta(text)]


def test_without_declared_tools_nothing_is_bare():
    text = '{"name": "Bash", "arguments": {}}'
    assert parse_all(parser(tools=()), text) == [TextDelta(text)]


def test_tagged_calls_keep_their_form():
    call = ToolCall("call_1", "Bash", '{"command": "ls"}')
    assert assistant_text(Message("assistant", "", tool_calls=(call,))).startswith("<tool_call>\n")
    # a bare-form call that no longer opens the turn is written in tags (only the opening can be bare)
    late = ToolCall("call_2-bja", "Bash", "{}")
    assert "<tool_call>" in assistant_text(Message("assistant", "Hi", tool_calls=(late,)))


AUTO = FenceSpec(tools=(A, B))


def test_auto_fence_accepts_a_bare_call_from_the_opening_brace(vocab):
    assert accepts(vocab, AUTO, '{"name": "A", "arguments": {"x": 1}}')
    assert accepts(vocab, AUTO, '{"name": "B", "parameters": {}}')
    assert not accepts(vocab, AUTO, '{"name": "A", "arguments": {"x": "one"}}')  # its schema holds
    assert not accepts(vocab, AUTO, '{"name": "A", "arguments": {"x": 1}}\nmore')  # and it is the whole answer


def test_auto_fence_text_cannot_open_like_a_bare_call(vocab):
    assert not accepts(vocab, AUTO, '{"name": "A", "args": 1}')
    assert not accepts(vocab, AUTO, '{ "name" : "B"}')
    assert accepts(vocab, AUTO, '{"name": "Paris"}')  # names no tool: an answer
    assert accepts(vocab, AUTO, '{"answer": 42}')


def test_bare_calls_only_under_auto(vocab):
    for choice in (ToolChoice("required"), ToolChoice("tool", "A"), ToolChoice("none")):
        assert not accepts(vocab, FenceSpec(tools=(A, B), choice=choice), '{"name": "A", "arguments": {"x": 1}}')
    assert accepts(vocab, FenceSpec(tools=(A, B), choice=ToolChoice("none")), '{"answer": 42}')
