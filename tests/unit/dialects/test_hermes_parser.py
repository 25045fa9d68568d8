"""Hermes / Qwen3 stream parser: conformance cases, each whole / per character / per token / in 100 random
groupings, over the real Qwen vocabulary (tags are single tokens) and a SentencePiece one (tags are text)."""

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
from zllm.canonical import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.hermes.dialect import HermesJson, Qwen3Hermes


def T(text):
    return TextDelta(text)


def R(text):
    return ReasoningDelta(text)


def call(index, name, arguments, *, streamed=None):
    """Start, the merged arguments deltas, End."""
    return [ToolCallStart(index, f"call_{index}", name), ToolCallArgsDelta(index, streamed or arguments),
            ToolCallEnd(index, arguments)]


def wrap(body):
    return f"<tool_call>\n{body}\n</tool_call>"


WEATHER = wrap('{"name": "get_weather", "arguments": {"city": "Paris"}}')
TYPED_ARGS = '{"n": -1.5e-3, "zero": 0, "big": 42, "ok": true, "no": false, "none": null, "list": [1, [2, {"x": []}]], "obj": {"a": {"b": "c"}}}'
ESCAPED_ARGS = ('{"q": "say \\"hi\\"", "path": "C:\\\\dir\\\\f", "uni": "é日本🙂", "esc": "\\u00e9\\n\\t", '
                '"tag": "</tool_call> and <tool_call> inside", "think": "</think>"}')

# (id, text, thinking, expected merged events)
CASES = [
    ("no_tool", "Hello, world!\nNo tools here.", False, [T("Hello, world!\nNo tools here.")]),
    ("single", WEATHER, False, call(0, "get_weather", '{"city": "Paris"}')),
    ("parallel", WEATHER + "\n" + wrap('{"name": "get_time", "arguments": {"tz": "CET"}}'), False,
     call(0, "get_weather", '{"city": "Paris"}') + call(1, "get_time", '{"tz": "CET"}')),
    ("typed_args", wrap('{"name": "f", "arguments": ' + TYPED_ARGS + "}"), False, call(0, "f", TYPED_ARGS)),
    ("empty_args", wrap('{"name": "ping", "arguments": {}}'), False, call(0, "ping", "{}")),
    ("text_around", "Let me check.\n" + WEATHER + "\nDone.", False,
     [T("Let me check."), *call(0, "get_weather", '{"city": "Paris"}'), T("\nDone.")]),
    ("escapes", wrap('{"name": "f", "arguments": ' + ESCAPED_ARGS + "}"), False, call(0, "f", ESCAPED_ARGS)),
    ("newline_alone_first", "\n" + WEATHER, False, [T("\n"), *call(0, "get_weather", '{"city": "Paris"}')]),
    # slips
    ("upper_case_tags", '<TOOL_CALL>\n{"name": "f", "arguments": {}}\n</TOOL_CALL>', False, call(0, "f", "{}")),
    ("stray_closer", "Hi</tool_call> there", False, [T("Hi there")]),
    ("loose_whitespace", '<tool_call>{ "name" : "f" ,\n  "arguments" : {"a":1 ,"b": [ 2 ]} }</tool_call>', False,
     call(0, "f", '{"a":1 ,"b": [ 2 ]}')),
    ("string_arguments", wrap('{"name": "f", "arguments": "{\\"a\\": \\"x\\\\y\\"}"}'), False,
     call(0, "f", '{"a": "x\\y"}')),
    ("parameters_key", wrap('{"name": "f", "parameters": {"a": 1}}'), False, call(0, "f", '{"a": 1}')),
    ("arguments_first", wrap('{"arguments": {"a": 1}, "name": "f"}'), False, call(0, "f", '{"a": 1}')),
    ("missing_closer", '<tool_call>\n{"name": "a", "arguments": {}}\n<tool_call>\n{"name": "b", "arguments": {}}',
     False, call(0, "a", "{}") + call(1, "b", "{}")),
    ("raw_newline_in_string", wrap('{"name": "f", "arguments": {"code": "a\nb"}}'), False,
     call(0, "f", '{"code": "a\nb"}')),
    # malformed: nothing lost
    ("malformed_not_json", 'Hi <tool_call>\nget_weather(city="Paris")\n</tool_call> ok', False,
     [T('Hi <tool_call>\nget_weather(city="Paris")\n</tool_call> ok')]),
    ("malformed_after_text", "Hi\n<tool_call>\nnot json\n</tool_call>", False,
     [T("Hi\n<tool_call>\nnot json\n</tool_call>")]),
    ("malformed_no_name", wrap('{"foo": 1}') + " after", False, [T(wrap('{"foo": 1}') + " after")]),
    ("malformed_name_not_string", wrap('{"name": 5}'), False, [T(wrap('{"name": 5}'))]),
    ("broken_inside_arguments", wrap('{"name": "f", "arguments": {"a": tru}}'), False, call(0, "f", '{"a": tru}')),
    ("broken_after_arguments", wrap('{"name": "f", "arguments": {"a": 1} oops}'), False,
     [*call(0, "f", '{"a": 1}'), T("oops}\n")]),
    # unclosed at the end of output
    ("unclosed_arguments", '<tool_call>\n{"name": "f", "arguments": {"a": [1, 2', False, call(0, "f", '{"a": [1, 2')),
    ("unclosed_before_arguments", '<tool_call>\n{"name": "f", "argu', False, call(0, "f", "{}")),
    ("unclosed_before_name", 'Hi\n<tool_call>\n{"name": "f', False, [T('Hi\n<tool_call>\n{"name": "f')]),
    ("no_closer_at_end", '<tool_call>\n{"name": "f", "arguments": {}}\n', False, call(0, "f", "{}")),
    ("partial_opener_at_end", "Hi <tool_ca", False, [T("Hi <tool_ca")]),
    # thinking (Qwen3)
    ("thinking_then_call", "<think>\nPlan: call it.\n</think>\n\n" + WEATHER, True,
     [R("Plan: call it."), *call(0, "get_weather", '{"city": "Paris"}')]),
    ("thinking_then_text", "<think>\nhmm\n\nyes\n</think>\n\nAnswer.", True, [R("hmm\n\nyes"), T("Answer.")]),
    ("thinking_empty", "<think>\n\n</think>\n\nAnswer.", True, [T("Answer.")]),
    ("thinking_without_block", "Just text.", True, [T("Just text.")]),
    ("thinking_unclosed", "<think>\nstill going\n", True, [R("still going\n")]),
    ("thinking_partial_tag_at_end", "<thi", True, [T("<thi")]),
    ("tool_call_inside_thinking", "<think>\nmaybe " + WEATHER + "\n</think>\n\nNo.", True,
     [R("maybe " + WEATHER), T("No.")]),
    ("thinking_off_keeps_tags_as_text", "<think>\nx\n</think>\n\nHi", False, [T("<think>\nx\n</think>\n\nHi")]),
]


def make_parser(thinking):
    dialect = Qwen3Hermes() if thinking else HermesJson()
    return lambda: dialect.parser((), thinking=thinking, new_call_id=counter())


@pytest.mark.parametrize("text,thinking,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_conformance_qwen_vocabulary(text, thinking, expected, qwen_tokenizer):
    assert assert_split_invariant(make_parser(thinking), text, tokenizer=qwen_tokenizer, groupings=100) == expected


@pytest.mark.parametrize("text,thinking,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_conformance_plain_text_vocabulary(text, thinking, expected, llama_tokenizer):
    assert assert_split_invariant(make_parser(thinking), text, tokenizer=llama_tokenizer, groupings=100) == expected


def test_hermes_never_reads_thinking():
    parser = HermesJson().parser((), thinking=True, new_call_id=counter())
    assert parser.feed("<think>\nx\n</think>\n\nHi") + parser.finish() == [T("<think>\nx\n</think>\n\nHi")]


def completed(text, thinking=False):
    parser = make_parser(thinking)()
    parser.feed(text)
    parser.finish()
    return parser.calls_completed


def test_calls_completed_counts_calls_that_ended_before_the_output():
    assert completed("Hello") == 0
    assert completed(WEATHER + "\n" + WEATHER) == 2
    assert completed('<tool_call>\n{"name": "f", "arguments": {}}') == 1  # JSON closed, no closer
    assert completed(wrap('{"name": "f", "arguments": {"a": tru}}')) == 1  # broken, but closed
    assert completed('<tool_call>\n{"name": "f", "arguments": {"a": 1') == 0  # cut off: ended by finish()
    assert completed(wrap("not json")) == 0


def test_start_goes_out_as_soon_as_the_name_is_complete():
    parser = make_parser(False)()
    assert parser.feed('Hi\n<tool_call>\n{"name": "get_weath') == [T("Hi")]
    assert parser.feed('er", "arguments": {"ci') == [ToolCallStart(0, "call_0", "get_weather"),
                                                      ToolCallArgsDelta(0, '{"ci')]
    assert parser.feed('ty": "Paris"}') == [ToolCallArgsDelta(0, 'ty": "Paris"}')]
    # the object's closing brace and the closer are framing, never arguments
    assert parser.feed("}\n</tool") == [ToolCallEnd(0, '{"city": "Paris"}')]
    assert parser.feed("_call>") == []
    assert parser.finish() == []


def test_a_possible_tag_is_held_back_not_leaked_as_text():
    parser = make_parser(False)()
    assert parser.feed("Hello\n") == [T("Hello")]
    assert parser.feed("<tool") == []
    assert parser.feed("box>") == [T("\n<toolbox>")]


def test_number_arguments_end_at_their_delimiter():
    events = parse_all(make_parser(False), wrap('{"name": "f", "arguments": 12}'))
    assert events == call(0, "f", "12")
