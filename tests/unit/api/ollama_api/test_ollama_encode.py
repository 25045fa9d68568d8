"""The Ollama encoders without a server: NDJSON lines fed token by token vs whole, and the final chunk."""

from __future__ import annotations

import itertools
import json

import pytest

from zllm.api.ollama.encode import (
    OllamaStreamEncoder,
    Timings,
    encode_line,
    tool_call_arguments,
)
from zllm.api.ollama.reply import OllamaReplyBuilder
from zllm.canonical import (
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

TEXT = 'Hello, "wörld"\n{}'
USAGE = Usage(prompt_tokens=20, completion_tokens=6, cached_tokens=16)
TIMING_KEYS = {"total_duration", "prompt_eval_duration", "eval_duration", "created_at"}


def ticking_clock(step: int = 1000):
    counter = itertools.count(0, step)
    return lambda: next(counter)


def stream_lines(kind: str, events) -> list[dict]:
    encoder = OllamaStreamEncoder(kind=kind, model="m", timings=Timings(ticking_clock()))
    data = b"".join(encode_line(obj) for event in events for obj in encoder.feed(event))
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode().split("\n")[:-1]]  # every line is one whole object


def without_timing(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("kind, text_of", [
    ("chat", lambda line: line["message"]["content"]),
    ("generate", lambda line: line["response"]),
])
def test_token_by_token_and_whole_give_the_same_text_and_final_line(kind, text_of):
    by_token = stream_lines(kind, [*(TextDelta(ch) for ch in TEXT), Finished(FinishReason.STOP, USAGE)])
    whole = stream_lines(kind, [TextDelta(TEXT), Finished(FinishReason.STOP, USAGE)])
    assert len(by_token) == len(TEXT) + 1 and len(whole) == 2
    assert "".join(text_of(line) for line in by_token) == "".join(text_of(line) for line in whole) == TEXT
    assert all(line["done"] is False for line in by_token[:-1])
    assert without_timing(by_token[-1]) == without_timing(whole[-1])
    final = whole[-1]
    assert final["done"] is True and final["done_reason"] == "stop" and text_of(final) == ""
    assert (final["prompt_eval_count"], final["eval_count"], final["zllm"]) == (20, 6, {"cached_tokens": 16})
    assert final["total_duration"] == final["prompt_eval_duration"] + final["eval_duration"] > 0
    # the non-streaming answer carries the same text and counts in one object
    builder = OllamaReplyBuilder(kind=kind, model="m", timings=Timings(ticking_clock()))
    for event in [*(TextDelta(ch) for ch in TEXT), Finished(FinishReason.STOP, USAGE)]:
        builder.feed(event)
    reply = builder.result()
    counts = ("done", "done_reason", "load_duration", "prompt_eval_count", "eval_count", "zllm")
    assert text_of(reply) == TEXT and {k: reply[k] for k in counts} == {k: final[k] for k in counts}


def test_reasoning_and_a_streamed_tool_call():
    events = [
        ReasoningDelta("let me"), ReasoningDelta(" see"),
        ToolCallStart(0, "call_1", "sh"), ToolCallArgsDelta(0, '{"cmd":'), ToolCallArgsDelta(0, '"ls"}'),
        ToolCallEnd(0, '{"cmd":"ls"}'),
        Finished(FinishReason.TOOL_CALLS, USAGE),
    ]
    lines = stream_lines("chat", events)
    assert [line["message"].get("thinking") for line in lines[:2]] == ["let me", " see"]
    # the call goes out once, whole, with its arguments as an object
    assert lines[2]["message"]["tool_calls"] == [{"id": "call_1", "function": {"index": 0, "name": "sh",
                                                                                  "arguments": {"cmd": "ls"}}}]
    assert len(lines) == 4 and lines[-1]["done_reason"] == "stop"


@pytest.mark.parametrize("reason, done_reason", [
    (FinishReason.STOP_SEQUENCE, "stop"), (FinishReason.LENGTH, "length"), (FinishReason.REPETITION, "repetition"),
])
def test_done_reasons(reason, done_reason):
    assert stream_lines("chat", [Finished(reason, USAGE)])[-1]["done_reason"] == done_reason


def test_error_is_a_last_error_line_and_abort_just_ends():
    error = Finished(FinishReason.ERROR, USAGE, error_code="engine_error", error_message="CUDA out of memory")
    assert stream_lines("chat", [TextDelta("a"), error])[-1] == {"error": "CUDA out of memory"}
    assert len(stream_lines("chat", [TextDelta("a"), Finished(FinishReason.ABORT, USAGE)])) == 1


def test_arguments_that_are_not_an_object_are_kept_as_text():
    assert tool_call_arguments('{"a": 1}') == {"a": 1}
    assert tool_call_arguments("") == {}
    assert tool_call_arguments('{"a": ') == {"_raw_arguments": '{"a": '}
    assert tool_call_arguments("[1]") == {"_raw_arguments": "[1]"}
