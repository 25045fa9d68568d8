"""The harmony parser: events for what gpt-oss writes (analysis, calls in both header spellings, answers,
preambles, slips), the same whole / character by character / token by token over o200k_harmony / in random
groupings, and parse ⇄ render: the next turn's prompt starts with this turn's prompt + output, through two calls
and their results, with the real template rendering the history."""

from __future__ import annotations

import json

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
from tests.support.harmony_models import harmony_tokenizer_or_skip
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
from zllm.dialects.harmony.dialect import Harmony
from zllm.dialects.harmony.format import MAX_HEADER
from zllm.dialects.registry import TokenizerFacts, choose_dialect

WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TOOLS = (WEATHER,)
ARGS = '{"city": "Paris"}'

CASES = [
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
     f"commentary json<|message|>{ARGS}",
     [ReasoningDelta("Need weather."), ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, ARGS),
      ToolCallEnd(0, ARGS)]),
    # the harmony renderer's spelling, as the model was trained to write it
    (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}",
     [ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, ARGS), ToolCallEnd(0, ARGS)]),
    ("<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant<|channel|>final<|message|>Hello <b>!",
     [ReasoningDelta("Greet."), TextDelta("Hello <b>!")]),
    # a commentary preamble before a call is text; `<|call|>` / `<|end|>` reaching the parser close the call
    (f"<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
     f"commentary json<|message|>{ARGS}<|call|>",
     [TextDelta("Checking."), ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, ARGS),
      ToolCallEnd(0, ARGS)]),
    # a model that writes no harmony at all: text (decided at the newline, or at the end of the output)
    ("Plain words\nand more", [TextDelta("Plain words\nand more")]),
    ("short", [TextDelta("short")]),
    ("x" * (MAX_HEADER + 5), [TextDelta("x" * (MAX_HEADER + 5))]),
    # output cut short inside a header: nothing to say
    ("<|channel|>analysis<|message|>Hm<|end|><|start|>assistant", [ReasoningDelta("Hm")]),
    # a missing <|end|>: the next <|start|> ends the message
    ("<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B",
     [ReasoningDelta("A"), TextDelta("B")]),
    # a call cut short keeps what it had
    (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Pa',
     [ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, '{"city": "Pa'),
      ToolCallEnd(0, '{"city": "Pa')]),
]


@pytest.fixture(scope="module")
def tokenizer():
    return harmony_tokenizer_or_skip()


def make_parser():
    return Harmony().parser(TOOLS, thinking=True, new_call_id=counter())


@pytest.mark.parametrize("text,expected", CASES, ids=range(len(CASES)))
def test_events_are_the_same_however_the_text_is_split(text, expected, tokenizer) -> None:
    assert assert_split_invariant(make_parser, text, tokenizer=tokenizer, groupings=100) == expected


def test_a_call_closed_by_its_own_marker_counts_as_completed() -> None:
    parser = make_parser()
    parser.feed(f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>")
    parser.finish()
    assert parser.calls_completed == 1
    cut = make_parser()
    cut.feed(f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}")
    cut.finish()  # the stop token `<|call|>` never reaches the parser: delivered, not counted as closed
    assert cut.calls_completed == 0


def test_the_registry_chooses_harmony_by_its_tokens(tokenizer) -> None:
    facts = TokenizerFacts(frozenset(tokenizer.get_added_vocab()), tokenizer.chat_template)
    choice = choose_dialect(facts)
    assert choice.name == "harmony" and "<|channel|>" in choice.reason
    assert choose_dialect(TokenizerFacts(frozenset({"<|channel|>"}), None)).name != "harmony"


# ------------------------------------------------------------------------------- parse ⇄ render


def parsed_reply(output: str) -> Message:
    events = parse_all(make_parser, output)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta)) or None
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    names = {e.index: (e.id, e.name) for e in events if isinstance(e, ToolCallStart)}
    calls = tuple(ToolCall(names[e.index][0], names[e.index][1], e.arguments) for e in events
                  if isinstance(e, ToolCallEnd))
    return Message("assistant", text, tool_calls=calls, reasoning=reasoning)


def test_two_calls_and_results_each_turn_extends_the_last_prompt_and_output(tokenizer) -> None:
    """Both through zllm's renderer and through gpt-oss's own template (the prompt a llama.cpp or vLLM user
    would get): each turn's prompt + output + `<|call|>` is where the next prompt starts."""
    from tests.unit.dialects.test_harmony_render import template_text

    history: tuple[Message, ...] = (Message("system", "Be brief."), Message("user", "Paris, then Rome?"))
    outputs = [
        '<|channel|>analysis<|message|>Paris first.<|end|><|start|>assistant to=functions.get_weather'
        '<|channel|>commentary json<|message|>{"city": "Paris"}',
        '<|channel|>analysis<|message|>Now Rome.<|end|><|start|>assistant to=functions.get_weather'
        '<|channel|>commentary json<|message|>{"city": "Rome"}',
    ]
    for n, output in enumerate(outputs):
        before = Harmony().render(Conversation(history, TOOLS), None)
        assert before == template_text(tokenizer, history, TOOLS)
        reply = parsed_reply(output)
        assert [c.arguments for c in reply.tool_calls] == [json.dumps({"city": ["Paris", "Rome"][n]})]
        history = (*history, reply, Message("tool", f"sunny {n}", tool_call_id=reply.tool_calls[0].id))
        after = Harmony().render(Conversation(history, TOOLS), None)
        assert after.startswith(before + output + "<|call|>")
        assert after == template_text(tokenizer, history, TOOLS)
        ids_before = tokenizer.encode(before + output + "<|call|>", add_special_tokens=False)
        assert tokenizer.encode(after, add_special_tokens=False)[:len(ids_before)] == ids_before
