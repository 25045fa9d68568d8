"""GLM-4.5 XML dialect: parser conformance (whole / per character / per token / random groupings), render ⇄ parse."""

from __future__ import annotations

import json

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter
from tests.support.glm_models import glm_token_id, glm_tokenizer
from zllm.canonical import (
    FunctionTool,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.base import Conversation
from zllm.dialects.glm.dialect import Glm45Xml
from zllm.dialects.glm.render import render_assistant_turn
from zllm.dialects.registry import TokenizerFacts, choose_dialect, dialect_named

DIALECT = Glm45Xml()
WEATHER = FunctionTool("get_weather", "Current weather", {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]}},
    "required": ["city"],
})
TYPED = FunctionTool("typed", "", {
    "type": "object",
    "properties": {"n": {"type": "number"}, "flag": {"type": "boolean"}, "items": {"type": "array"},
                   "obj": {"type": "object"}, "nothing": {"type": "null"}, "code": {"type": "string"}},
})
NOOP = FunctionTool("noop", "", {"type": "object", "properties": {}})
TOOLS = (WEATHER, TYPED, NOOP)

PARIS_CALL = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"


def make_parser(thinking: bool = True):
    return lambda: DIALECT.parser(TOOLS, thinking=thinking, new_call_id=counter())


def parse(text: str, *, thinking: bool = True) -> list:
    """Events of `text`, checked split-invariant over the GLM stand-in's token cuts and 100 random groupings."""
    return assert_split_invariant(make_parser(thinking), text, tokenizer=glm_tokenizer(), groupings=100)


def call_events(index: int, name: str, arguments: str) -> list:
    return [ToolCallStart(index, f"call_{index}", name), ToolCallArgsDelta(index, arguments),
            ToolCallEnd(index, arguments)]


def completed(text: str) -> int:
    parser = make_parser()()
    parser.feed(text)
    parser.finish()
    return parser.calls_completed


# ------------------------------------------------------------------------------------------ conformance


def test_no_tool_plain_text_drops_only_the_leading_separator():
    assert parse("\nHello there.\n\nBye.") == [TextDelta("Hello there.\n\nBye.")]


def test_single_call_after_reasoning():
    text = f"\n<think>Need the weather.</think>\n{PARIS_CALL}"
    assert parse(text) == [ReasoningDelta("Need the weather."), *call_events(0, "get_weather", '{"city": "Paris"}')]
    assert completed(text) == 1


def test_parallel_calls_one_newline_apart():
    text = f"\n{PARIS_CALL}\n<tool_call>noop\n</tool_call>"
    assert parse(text) == [*call_events(0, "get_weather", '{"city": "Paris"}'), *call_events(1, "noop", "{}")]
    assert completed(text) == 2


def test_typed_values_follow_the_schema():
    text = ("\n<tool_call>typed\n<arg_key>n</arg_key>\n<arg_value>2.5</arg_value>\n"
            "<arg_key>flag</arg_key>\n<arg_value>true</arg_value>\n"
            '<arg_key>items</arg_key>\n<arg_value>[1, "two"]</arg_value>\n'
            '<arg_key>obj</arg_key>\n<arg_value>{"a": {"b": null}}</arg_value>\n'
            "<arg_key>nothing</arg_key>\n<arg_value>null</arg_value>\n"
            "<arg_key>code</arg_key>\n<arg_value>123</arg_value>\n</tool_call>")
    arguments = '{"n": 2.5, "flag": true, "items": [1, "two"], "obj": {"a": {"b": null}}, "nothing": null, "code": "123"}'
    assert parse(text) == call_events(0, "typed", arguments)


def test_non_json_value_of_a_typed_or_unknown_key_falls_back_to_a_string():
    text = ("\n<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>three</arg_value>\n"
            "<arg_key>extra</arg_key>\n<arg_value>42</arg_value>\n"
            "<arg_key>other</arg_key>\n<arg_value>NaN</arg_value>\n</tool_call>")
    assert parse(text) == call_events(0, "get_weather", '{"days": "three", "extra": 42, "other": "NaN"}')


def test_empty_arguments():
    assert parse("\n<tool_call>noop\n</tool_call>") == call_events(0, "noop", "{}")


def test_text_around_calls():
    text = f"\nLet me check.\n{PARIS_CALL}\nDone."
    assert parse(text) == [TextDelta("Let me check."), *call_events(0, "get_weather", '{"city": "Paris"}'),
                           TextDelta("Done.")]


def test_escapes_in_string_values():
    value = 'He said "hi" \\ <b>bold</b> a<b\nline 2\ttab 日本語 🎉'
    text = f"\n<tool_call>typed\n<arg_key>code</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"
    events = parse(text)
    assert events == call_events(0, "typed", json.dumps({"code": value}, ensure_ascii=False, separators=(", ", ": ")))
    assert json.loads(events[-1].arguments) == {"code": value}


def test_markup_in_plain_text_that_is_not_a_tag_stays_text():
    assert parse("\nUse <tool> or <arg>, not <think_hard>.") == [TextDelta("Use <tool> or <arg>, not <think_hard>.")]


@pytest.mark.parametrize("text", [
    "\n<tool_call>get weather now\n</tool_call>",  # a name with spaces is prose
    "\n<tool_call>\n</tool_call>",  # no name
    "\n<tool_call>" + "x" * 200,  # a name line that never ends
])
def test_malformed_name_line_is_text(text):
    events = parse(text)
    assert all(isinstance(e, TextDelta) for e in events)
    assert "".join(e.text for e in events).startswith("<tool_call>")


def test_junk_inside_a_call_ends_it_and_stays_text():
    text = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\nso then</tool_call>"
    assert parse(text) == [*call_events(0, "get_weather", '{"city": "Paris"}'), TextDelta("so then")]
    assert completed(text) == 0


def test_pair_without_value_is_given_back_as_text():
    text = "\n<tool_call>get_weather\n<arg_key>city</arg_key>Paris</tool_call>"
    assert parse(text) == [*call_events(0, "get_weather", "{}"), TextDelta("<arg_key>city</arg_key>Paris")]


def test_slips_are_tolerated():
    # upper-case tags, no newlines, spaces between pairs (as GLM-4.5-Air was seen to write), a stray closer
    text = ("\nok</think> <TOOL_CALL>ls <arg_key>dirPath</arg_key> <arg_value>backend</arg_value> </TOOL_CALL>"
            "</tool_call>")
    assert parse(text) == [TextDelta("ok "), *call_events(0, "ls", '{"dirPath": "backend"}')]


def test_missing_value_closer_before_call_closer():
    text = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</tool_call>"
    assert parse(text) == call_events(0, "get_weather", '{"city": "Paris"}')


def test_thinking_on_and_off():
    assert parse("\n<think>Let me think.\nMore.</think>\nAnswer.") == [
        ReasoningDelta("Let me think.\nMore."), TextDelta("Answer.")]
    # thinking off: the prompt already holds `<think></think>`, the model writes "\n" + the answer
    assert parse("\nAnswer.", thinking=False) == [TextDelta("Answer.")]
    assert parse(f"\n{PARIS_CALL}", thinking=False) == call_events(0, "get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize(("text", "arguments"), [
    ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", '{"city": "Par"}'),
    ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_val", '{"city": "Paris</arg_val"}'),
    ("\n<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>1", '{"days": 1}'),
    ("\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n<arg_key>da", '{"city": "P"}'),
    ("\n<tool_call>get_weather\n", "{}"),
])
def test_unclosed_call_at_eos_ends_with_the_arguments_so_far(text, arguments):
    assert parse(text) == call_events(0, "get_weather", arguments)
    assert completed(text) == 0


def test_unfinished_name_line_at_eos_is_text():
    assert parse("\nSee <tool_call>get_wea") == [TextDelta("See <tool_call>get_wea")]


def test_unclosed_reasoning_at_eos():
    assert parse("\n<think>still thinking</thi") == [ReasoningDelta("still thinking</thi")]


# ------------------------------------------------------------------------------------------ streaming


def test_partial_tags_are_held_back_never_emitted():
    parser = make_parser()()
    assert parser.feed("\nHello <tool_") == [TextDelta("Hello ")]
    assert parser.feed("x") == [TextDelta("<tool_x")]
    assert parser.feed("\n") == []  # a trailing newline may be the separator before a call
    assert parser.feed("<tool_call>noop\n") == [ToolCallStart(0, "call_0", "noop")]


def test_call_starts_at_name_line_and_string_values_stream():
    parser = make_parser()()
    assert parser.feed("\n<tool_call>get_weather") == []
    assert parser.feed("\n<arg_key>city</arg_key>\n<arg_value>Pa") == [
        ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, '{"city": "'), ToolCallArgsDelta(0, "Pa")]
    assert parser.feed('ri"s</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3') == [
        ToolCallArgsDelta(0, 'ri\\"s'), ToolCallArgsDelta(0, '"')]
    assert parser.feed("</arg_value>\n</tool_call>") == [
        ToolCallArgsDelta(0, ', "days": 3'), ToolCallArgsDelta(0, "}"), ToolCallEnd(0, '{"city": "Pari\\"s", "days": 3}')]


# ------------------------------------------------------------------------------------------ render ⇄ parse


def events_to_message(events: list) -> Message:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta)) or None
    starts = {e.index: e for e in events if isinstance(e, ToolCallStart)}
    calls = tuple(ToolCall(starts[e.index].id, starts[e.index].name, e.arguments)
                  for e in events if isinstance(e, ToolCallEnd))
    return Message("assistant", text, tool_calls=calls, reasoning=reasoning)


ASSISTANT_TURNS = [
    Message("assistant", "Plain answer."),
    Message("assistant", "Checking.", reasoning="The user wants weather.",
            tool_calls=(ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3, "units": "c"}'),)),
    Message("assistant", "", tool_calls=(
        ToolCall("call_0", "typed", '{"n": 1.5, "items": [1, {"a": "b"}], "flag": false, "code": "x = \\"<a>\\"\\n"}'),
        ToolCall("call_1", "noop", "{}"))),
    Message("assistant", "", tool_calls=(ToolCall("call_0", "get_weather", '{"city": "北京", "days": "3"}'),)),
]


@pytest.mark.parametrize("message", ASSISTANT_TURNS)
def test_parse_of_rendered_turn_gives_the_turn_back(message):
    text = render_assistant_turn(message, {t.name: t for t in TOOLS}, keep_reasoning=True)
    assert events_to_message(parse(text)) == message


OUTPUTS = [  # (thinking, what the model writes after the generation prompt)
    (True, "\n<think>Think first.</think>\nThe answer is 4."),
    (True, f"\n<think>Need a tool.</think>\nLet me look.\n{PARIS_CALL}\n<tool_call>noop\n</tool_call>"),
    (True, ("\n<think></think>\n<tool_call>typed\n<arg_key>items</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
           "<arg_key>code</arg_key>\n<arg_value>if a < b:\n    print(\"x\")</arg_value>\n</tool_call>")),
    (False, "\nThe answer is 4."),  # the generation prompt already closed an empty <think></think>
    (False, f"\nLet me look.\n{PARIS_CALL}"),
]


@pytest.mark.parametrize(("thinking", "output"), OUTPUTS)
def test_render_of_parsed_output_gives_the_output_back(thinking, output):
    """Turn N+1's prompt starts with turn N's prompt + output, byte for byte: the prefix cache hits."""
    history = (Message("system", "Be brief."), Message("user", "Weather in Paris?"))
    prompt = DIALECT.render(Conversation(history, TOOLS, thinking=thinking), None)
    reply = events_to_message(parse(output, thinking=thinking))
    follow_up = DIALECT.render(Conversation((*history, reply), TOOLS, thinking=thinking, add_generation_prompt=False),
                               None)
    assert follow_up == prompt + output


def test_prompt_framing_and_tool_results():
    conversation = Conversation((
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=(ToolCall("c0", "get_weather", '{"city": "Paris"}'),
                                             ToolCall("c1", "noop", "{}"))),
        Message("tool", "sunny", tool_call_id="c0"), Message("tool", "ok", tool_call_id="c1"),
    ), (NOOP,), thinking=False)
    prompt = DIALECT.render(conversation, None)
    assert prompt.startswith('[gMASK]<sop><|system|>\n# Tools\n')
    assert '<tools>\n{"type": "function", "function": {"name": "noop", "parameters": {"type": "object", ' \
           '"properties": {}}}}\n</tools>' in prompt
    assert prompt.endswith(
        "<|user|>\nWeather?/nothink<|assistant|>\n<think></think>\n" + PARIS_CALL + "\n<tool_call>noop\n</tool_call>"
        "<|observation|>\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nok\n</tool_response>"
        "<|assistant|>\n<think></think>")
    ids = glm_tokenizer().encode(prompt, add_special_tokens=False)
    assert ids[:3] == [glm_token_id("[gMASK]"), glm_token_id("<sop>"), glm_token_id("<|system|>")]
    assert ids.count(glm_token_id("<tool_call>")) == 2 + 1  # the two calls and the format example


def test_reasoning_of_turns_before_the_last_user_turn_is_dropped():
    conversation = Conversation((
        Message("user", "a"), Message("assistant", "b", reasoning="old"),
        Message("user", "c"), Message("assistant", "d", reasoning="new"),
    ), add_generation_prompt=False, thinking=True)
    assert DIALECT.render(conversation, None) == (
        "[gMASK]<sop><|user|>\na<|assistant|>\n<think></think>\nb<|user|>\nc<|assistant|>\n<think>new</think>\nd")


def test_dialect_declaration():
    assert dialect_named("glm45").name == "glm45" and not DIALECT.needs_chat_template
    assert choose_dialect(TokenizerFacts(frozenset(glm_tokenizer().get_added_vocab()), None)).name == "glm45"
    assert DIALECT.end_of_turn == ("<|observation|>", "<|user|>")
    assert DIALECT.supports_thinking and DIALECT.thinking_default
    assert set(DIALECT.markup) == {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                   "<arg_value>", "</arg_value>"}
