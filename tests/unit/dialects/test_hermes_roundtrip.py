"""Render ⇄ parse on random well-formed assistant turns: parse(render(turn)) == turn and
render(parse(output)) == output, split-invariantly, for Hermes and Qwen3 (thinking on and off)."""

import json
import random

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter
from zllm.canonical import (
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.hermes.dialect import HermesJson, Qwen3Hermes
from zllm.dialects.hermes.render import assistant_text

# chunks that can never spell a tag (no "tool"; reasoning gets no "/", so no "</think>")
CONTENT_CHUNKS = ["a", "Hi ", "\n", "\n\n", "<", ">", "{", "}", '"', "\\", "é", "日本", " ", "/", "think", "🙂"]
REASONING_CHUNKS = [c for c in CONTENT_CHUNKS if c != "/"]
STRINGS = ["", "x", 'say "hi"', "C:\\dir", "é日本🙂", "line\nbreak\ttab", "</tool_call> <tool_call>", "\u0001"]


def random_text(rng, chunks, most=8):
    return "".join(rng.choice(chunks) for _ in range(rng.randint(0, most)))


def random_value(rng, depth=0):
    kind = rng.randrange(7 if depth < 2 else 5)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.choice([0.5, -1.25e-7, 3.0, 1e21])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return rng.choice(STRINGS)
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return random_object(rng, depth + 1)


def random_object(rng, depth=0):
    return {rng.choice(["city", "n", "deep", "ключ", "a b"]) + str(i): random_value(rng, depth)
            for i in range(rng.randint(0, 3))}


def random_turn(rng, *, thinking):
    calls = tuple(ToolCall(f"call_{i}", rng.choice(["get_weather", "ping", "a-b.c"]),
                           json.dumps(random_object(rng), ensure_ascii=False, separators=(", ", ": ")))
                  for i in range(rng.choice([0, 0, 1, 1, 2, 3])))
    reasoning = random_text(rng, REASONING_CHUNKS) if thinking else None
    return Message("assistant", random_text(rng, CONTENT_CHUNKS), tool_calls=calls, reasoning=reasoning)


def output_of(turn, *, thinking):
    """What the model wrote for `turn` (the assistant content the dialect renders)."""
    thought = f"<think>\n{turn.reasoning}\n</think>\n\n" if thinking else ""
    return thought + assistant_text(turn)


def turn_of(events, *, thinking):
    names = {e.index: (e.id, e.name) for e in events if isinstance(e, ToolCallStart)}
    return Message("assistant", "".join(e.text for e in events if isinstance(e, TextDelta)),
                   tool_calls=tuple(ToolCall(*names[e.index], e.arguments) for e in events
                                    if isinstance(e, ToolCallEnd)),
                   reasoning="".join(e.text for e in events if isinstance(e, ReasoningDelta)) if thinking else None)


@pytest.mark.parametrize("dialect,thinking", [(HermesJson(), False), (Qwen3Hermes(), True), (Qwen3Hermes(), False)],
                         ids=["hermes", "qwen3_thinking", "qwen3_no_thinking"])
def test_random_turns_round_trip(dialect, thinking):
    rng = random.Random(20240611)
    for _ in range(150):
        turn = random_turn(rng, thinking=thinking)
        output = output_of(turn, thinking=thinking)
        events = assert_split_invariant(lambda: dialect.parser((), thinking=thinking, new_call_id=counter()),
                                        output, groupings=8)
        parsed = turn_of(events, thinking=thinking)
        assert parsed == turn, output
        assert output_of(parsed, thinking=thinking) == output
