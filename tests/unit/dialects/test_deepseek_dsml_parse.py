"""DeepSeek DSML output → canonical events: one conformance suite, run whole, per character, per token of the
real V3.1 and V4 vocabularies and in random groupings; render ⇄ parse inverses."""

from __future__ import annotations

import json

import pytest

from tests.support.deepseek_models import deepseek_v31_tokenizer, v4_tokenizer_or_skip
from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
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
from zllm.dialects.dsml.dialect import DeepSeekV4Dsml, DeepSeekV32Dsml
from zllm.dialects.dsml.render import assistant_output

TOOLS = (
    FunctionTool("get_weather", "", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
    FunctionTool("ping", "", {"type": "object", "properties": {}}),
    FunctionTool("configure", "", {"type": "object", "properties": {
        "retries": {"type": "integer"}, "verbose": {"type": "boolean"}, "tags": {"type": "array"},
        "options": {"type": "object"}, "ratio": {"type": "number"}, "note": {"type": ["string", "null"]}}}),
)

OPEN, CLOSE = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
PARIS = ('<｜DSML｜invoke name="get_weather">\n'
         '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
         '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
         '</｜DSML｜invoke>')
PING = '<｜DSML｜invoke name="ping">\n\n</｜DSML｜invoke>'
PARIS_ARGS = '{"city": "Paris", "days": 3}'


def calls_block(*invokes: str) -> str:
    return f"\n\n{OPEN}\n" + "\n".join(invokes) + f"\n{CLOSE}"


def call_events(index: int, name: str, arguments: str) -> list:
    return [ToolCallStart(index, f"call_{index}", name), ToolCallArgsDelta(index, arguments),
            ToolCallEnd(index, arguments)]


CONFIGURE = ('<｜DSML｜invoke name="configure">\n'
             '<｜DSML｜parameter name="retries" string="false">2</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="verbose" string="false">true</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="tags" string="false">["a", "b"]</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="options" string="false">{"x": {"y": null}}</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="ratio" string="false">0.5</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="note" string="false">null</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>')
ESCAPES = ('<｜DSML｜invoke name="get_weather">\n'
           '<｜DSML｜parameter name="city" string="true">Say "hi" \\ to\nSão Paulo <b>&amp;</b> 日本</｜DSML｜parameter>\n'
           '</｜DSML｜invoke>')

# name → (thinking, model output, merged events, well formed: render(parse(output)) == output)
CASES: dict[str, tuple[bool, str, list, bool]] = {
    "no_tool": (False, "Hello, world.\n\nBye.", [TextDelta("Hello, world.\n\nBye.")], True),
    "thinking_no_tool": (True, "Plan it.</think>The answer.",
                         [ReasoningDelta("Plan it."), TextDelta("The answer.")], True),
    "single": (True, "Need weather.</think>" + calls_block(PARIS),
               [ReasoningDelta("Need weather."), *call_events(0, "get_weather", PARIS_ARGS)], True),
    "parallel": (False, calls_block(PARIS, PING),
                 [*call_events(0, "get_weather", PARIS_ARGS), *call_events(1, "ping", "{}")], True),
    "typed_args": (False, calls_block(CONFIGURE), call_events(0, "configure", json.dumps(
        {"retries": 2, "verbose": True, "tags": ["a", "b"], "options": {"x": {"y": None}}, "ratio": 0.5,
         "note": None})), True),
    "empty_args": (True, "</think>" + calls_block(PING), call_events(0, "ping", "{}"), True),
    "surrounding_text": (False, "Let me check.\n" + calls_block(PARIS) + "Done.",
                         [TextDelta("Let me check.\n"), *call_events(0, "get_weather", PARIS_ARGS),
                          TextDelta("Done.")], False),
    "escapes": (False, "Sure." + calls_block(ESCAPES),
                [TextDelta("Sure."), *call_events(0, "get_weather", json.dumps(
                    {"city": 'Say "hi" \\ to\nSão Paulo <b>&amp;</b> 日本'}, ensure_ascii=False))], True),
    "malformed_block": (False, f"Hi\n\n{OPEN}\nnot a call</｜DSML｜invoke>",
                        [TextDelta(f"Hi\n\n{OPEN}\nnot a call")], False),
    "malformed_invoke_name": (False, f"{OPEN}\n<｜DSML｜invoke name=\"get\nweather\">x",
                              [TextDelta(f"{OPEN}\n<｜DSML｜invoke name=\"get\nweather\">x")], False),
    "empty_invoke_name": (False, f"{OPEN}\n<｜DSML｜invoke name=\"\">\n", [TextDelta(f"{OPEN}\n<｜DSML｜invoke name=\"\">\n")],
                          False),
    "unclosed_at_eos": (False, f"\n\n{OPEN}\n{PARIS}\n" + PARIS.split("<｜DSML｜parameter name=\"days\"")[0]
                        + '<｜DSML｜parameter name="days" string="false">1',
                        [*call_events(0, "get_weather", PARIS_ARGS),
                         *call_events(1, "get_weather", '{"city": "Paris", "days": 1}')], False),
    "opener_only_at_eos": (True, f"Hmm</think>\n\n{OPEN}\n", [ReasoningDelta("Hmm"), TextDelta(f"\n\n{OPEN}\n")],
                           False),
    "ascii_bar_slip": (False, calls_block(PARIS).replace("｜DSML｜", "|DSML|"),
                       call_events(0, "get_weather", PARIS_ARGS), False),
    "stray_closers_dropped": (False, "A</think>B</｜DSML｜invoke>C", [TextDelta("ABC")], False),
    "reopened_think": (True, "<think>Plan</think>Go", [ReasoningDelta("Plan"), TextDelta("Go")], False),
    "block_inside_reasoning": (True, "Plan" + calls_block(PING), [ReasoningDelta("Plan"), *call_events(0, "ping", "{}")],
                               False),
    "bad_parameter_header": (False, calls_block(PARIS.replace('name="days" string="false"', 'name="days" strin')),
                             [ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, '{"city": "Paris"'),
                              TextDelta('<｜DSML｜parameter name="days" strin>3</｜DSML｜parameter>\n'),
                              ToolCallArgsDelta(0, "}"), ToolCallEnd(0, '{"city": "Paris"}')], False),
    "missing_closers": (False, calls_block(PARIS.replace("3</｜DSML｜parameter>\n", "3"), PING).replace(
                            "\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"ping\">", "\n<｜DSML｜invoke name=\"ping\">"),
                        [*call_events(0, "get_weather", PARIS_ARGS), *call_events(1, "ping", "{}")], False),
    "partial_tags_are_text": (False, "a < b, c <｜DSM d </ e", [TextDelta("a < b, c <｜DSM d </ e")], True),
}


@pytest.fixture(params=["v3.2", "v4"])
def flavour(request):
    """(dialect, tokenizer, rewrite of V3.2 text into this dialect's)."""
    if request.param == "v3.2":
        return DeepSeekV32Dsml(), deepseek_v31_tokenizer(), lambda text: text
    return DeepSeekV4Dsml(), v4_tokenizer_or_skip(), lambda text: text.replace("function_calls", "tool_calls")


def make_parser(dialect, thinking: bool):
    return lambda: dialect.parser(TOOLS, thinking=thinking, new_call_id=counter())


@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance_split_invariant(flavour, case: str) -> None:
    dialect, tokenizer, rewrite = flavour
    thinking, text, expected, _ = CASES[case]
    events = assert_split_invariant(make_parser(dialect, thinking), rewrite(text), tokenizer=tokenizer, groupings=100)
    assert events == [TextDelta(rewrite(e.text)) if isinstance(e, TextDelta) else e for e in expected]


@pytest.mark.parametrize("case", sorted(name for name, (*_, well_formed) in CASES.items() if well_formed))
def test_rendering_a_parsed_output_gives_it_back(flavour, case: str) -> None:
    dialect, _, rewrite = flavour
    thinking, text, _, _ = CASES[case]
    message = message_from(parse_all(make_parser(dialect, thinking), rewrite(text)), thinking=thinking)
    assert assistant_output(dialect.family, message, with_reasoning=thinking) == rewrite(text)


@pytest.mark.parametrize("thinking", [True, False])
def test_parsing_a_rendered_turn_gives_it_back(flavour, thinking: bool) -> None:
    dialect, _, _ = flavour
    turns = [
        Message("assistant", "Checking both.", (ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3}'),
                                                ToolCall("call_1", "ping", "{}")), reasoning="two calls"),
        Message("assistant", "", (ToolCall("call_0", "configure", '{"tags": [1, {"a": "é"}], "note": "x"}'),)),
        Message("assistant", "Just text.\n\n"),
    ]
    for turn in turns:
        text = assistant_output(dialect.family, turn, with_reasoning=thinking)
        parsed = message_from(parse_all(make_parser(dialect, thinking), text), thinking=thinking)
        # without thinking the prompt leaves reasoning out; with it, "no reasoning" is written as an empty one
        assert parsed == Message("assistant", turn.content, turn.tool_calls,
                                 reasoning=(turn.reasoning or "") if thinking else None)


def test_events_stream_as_the_markup_completes() -> None:
    """ToolCallStart as soon as the invoke tag is read, one ArgsDelta per finished parameter."""
    parser = DeepSeekV32Dsml().parser(TOOLS, thinking=True, new_call_id=counter())
    assert parser.feed("Hm") == [ReasoningDelta("Hm")]
    assert parser.feed(f"</think>\n\n{OPEN}\n<｜DSML｜invoke name=\"get_weather\">") == [
        ToolCallStart(0, "call_0", "get_weather")]
    assert parser.feed('\n<｜DSML｜parameter name="city" string="true">Par') == []
    assert parser.feed("is</｜DSML｜parameter>\n</｜DSML｜inv") == [ToolCallArgsDelta(0, '{"city": "Paris"')]
    assert parser.feed("oke>") == [ToolCallArgsDelta(0, "}"), ToolCallEnd(0, '{"city": "Paris"}')]
    assert parser.calls_completed == 1


def test_calls_completed_counts_closed_calls_only() -> None:
    parser = DeepSeekV32Dsml().parser(TOOLS, thinking=False, new_call_id=counter())
    parser.feed(calls_block(PARIS, PING)[:-len(CLOSE) - 1 - len("</｜DSML｜invoke>")])
    parser.finish()
    assert parser.calls_completed == 1


def message_from(events: list, *, thinking: bool) -> Message:
    """The assistant turn a list of merged events describes."""
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    names = {e.index: (e.id, e.name) for e in events if isinstance(e, ToolCallStart)}
    calls = tuple(ToolCall(*names[e.index], e.arguments) for e in events if isinstance(e, ToolCallEnd))
    return Message("assistant", content, calls, reasoning=reasoning if thinking else None)


FRAGMENTS = ["<think>", "</think>", "\n", "\n\n", " ", "x", "Paris", "<", ">", '"', '">', "</", "｜DSML｜", "|DSML|",
             OPEN, CLOSE, "<｜DSML｜invoke name=\"", "get_weather", "ping", "</｜DSML｜invoke>",
             '<｜DSML｜parameter name="', 'city" string="true"', 'days" string="false"', "3", "</｜DSML｜parameter>",
             "<｜DSML｜tool_calls>", "<｜DSML｜par"]


@pytest.mark.parametrize("seed", range(2))
def test_random_markup_soup_is_split_invariant(seed: int) -> None:
    """Whatever the model writes, splitting it differently never changes the events."""
    import random

    rng = random.Random(seed)
    for _ in range(30):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 30)))
        for thinking in (True, False):
            assert_split_invariant(make_parser(DeepSeekV32Dsml(), thinking), text, groupings=15)
