"""Bare JSON calls in GLM-4.5 (issue 21 item 4; dialects/bare_json.py): content that opens (after GLM's "\\n", and
after the reasoning block) with `{"name": DECLARED, "arguments": {...}}` is a call, parsed split-invariantly over
the GLM stand-in's token cuts and random groupings; it renders back bare, so the next prompt continues this turn's
prompt + output; the `auto` fence admits it (tags as added tokens or as plain text) and free text may not open
that way; other modes never let it through; JSON naming no declared tool stays text."""

from __future__ import annotations

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
from tests.support.glm_models import glm_tokenizer
from tests.unit.dialects.test_glm_grammar import TOOLS, accepts, grammar, plain_ids
from zllm.canonical import Message, ReasoningDelta, TextDelta, ToolCall, ToolCallEnd, ToolCallStart, ToolChoice
from zllm.dialects.base import Conversation, MarkupTokens
from zllm.dialects.glm.dialect import Glm45Xml
from zllm.dialects.glm.render import OBSERVATION, render_prompt

DIALECT = Glm45Xml()
ARGS = '{"city": "Paris <b>", "days": 3}'
BARE = '{"name": "get_weather", "arguments": %s}' % ARGS
OWN = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"


def parse(text: str) -> list:
    make = lambda: DIALECT.parser(TOOLS, thinking=True, new_call_id=counter())  # noqa: E731
    return assert_split_invariant(make, text, tokenizer=glm_tokenizer(), groupings=60)


@pytest.mark.parametrize("head", ["\n", "", "\n<think>I need the tool</think>\n"])
def test_a_bare_call_opening_the_content_is_a_call(head):
    events = parse(head + BARE)
    assert [e for e in events if not isinstance(e, ReasoningDelta)][0] == ToolCallStart(0, "call_0-bja", "get_weather")
    assert events[-1] == ToolCallEnd(0, ARGS) and not any(isinstance(e, TextDelta) for e in events), events


def test_the_familys_own_calls_and_text_follow_it():
    events = parse("\n" + BARE + "\n" + OWN)
    assert [(type(e).__name__, e.index) for e in events if isinstance(e, ToolCallStart)] == [
        ("ToolCallStart", 0), ("ToolCallStart", 1)]
    assert parse("\n" + BARE + "\n\nDone.")[-1] == TextDelta("Done.")


@pytest.mark.parametrize("text", ['{"name": "Paris", "arguments": {}}', '{"city": "Paris", "name": "search"}',
                                  '{"answer": 42}', ' {"name": "search", "arguments": {}}', 'So: ' + BARE])
def test_other_json_stays_text(text):
    assert parse("\n" + text) == [TextDelta(text)]
    no_tools = parse_all(lambda: DIALECT.parser((), thinking=True, new_call_id=counter()), "\n" + BARE)
    assert no_tools == [TextDelta(BARE)]


@pytest.mark.parametrize("thinking", [False, True])
def test_the_next_prompt_continues_a_bare_call(thinking):
    user = Message("user", "Weather in Paris?")
    prompt = render_prompt(Conversation((user,), TOOLS, thinking=thinking))
    output = ("\n<think>I need the tool</think>" if thinking else "") + "\n" + BARE
    events = parse_all(lambda: DIALECT.parser(TOOLS, thinking=thinking, new_call_id=counter()), output)
    start, end = next(e for e in events if isinstance(e, ToolCallStart)), events[-1]
    call = ToolCall(start.id, start.name, end.arguments)
    reasoning = "I need the tool" if thinking else None
    turn = Message("assistant", "", tool_calls=(call,), reasoning=reasoning)
    following = render_prompt(Conversation((user, turn, Message("tool", "sunny", tool_call_id=call.id)), TOOLS,
                                           thinking=thinking))
    assert following.startswith(prompt + output + OBSERVATION), (prompt + output, following)


@pytest.mark.parametrize("single", [True, False], ids=["added-tokens", "plain-tags"])
def test_the_auto_fence_admits_a_bare_call_and_keeps_text_from_opening_so(single):
    markup = None if single else MarkupTokens()
    ids = (lambda text: text) if single else plain_ids
    auto = grammar(markup)
    assert accepts(auto, ids("\n" + BARE))
    assert accepts(auto, ids("\n" + BARE.replace('"arguments"', '"parameters"')))
    assert accepts(grammar(markup, thinking=True), ids("\n<think>hmm</think>\n" + BARE))
    assert not accepts(auto, ids("\n" + BARE + "\nmore"))  # the whole answer
    assert not accepts(auto, ids('\n{"name": "get_weather", "arguments": {"days": 3}}'))  # the schema holds
    assert not accepts(auto, ids('\n{"name": "search", "args": 1}'))  # text may not open as a bare call does
    assert not accepts(auto, ids('\n{"name": "search", "args": 1}\n' + OWN))  # not before a call either
    assert accepts(auto, ids('\n{"answer": 42}'))
    assert accepts(auto, ids('\n{"answer": 42}\n' + OWN))
    for choice in (ToolChoice("required"), ToolChoice("tool", "get_weather"), ToolChoice("none")):
        assert not accepts(grammar(markup, choice=choice), ids("\n" + BARE)), choice
    assert accepts(grammar(markup, choice=ToolChoice("none")), ids('\n{"answer": 42}'))
