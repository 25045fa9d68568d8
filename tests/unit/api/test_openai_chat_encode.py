"""Golden tests: canonical events → chat.completion.chunk dicts, and → one chat.completion object."""

from __future__ import annotations

import pytest

from tests.support.fake_engine import error_events, text_events, tool_call_events
from zllm.api.errors import ReportedError
from zllm.api.openai_chat.completion import ChatCompletionBuilder
from zllm.api.openai_chat.encode import ChatStreamEncoder
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
from zllm.errors import Overloaded

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": None}


def chunk(delta: dict, finish_reason=None, **extra) -> dict:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            **extra}


def encode_stream(events, include_usage=False) -> list:
    encoder = ChatStreamEncoder(completion_id="chatcmpl-1", model="m", created=1, include_usage=include_usage)
    frames = encoder.start()
    for event in events:
        frames += encoder.feed(event)
    return frames


def build(events) -> dict:
    builder = ChatCompletionBuilder(completion_id="chatcmpl-1", model="m", created=1)
    for event in events:
        builder.feed(event)
    return builder.result()


def test_text_stream_golden():
    assert encode_stream(text_events("Hel", "lo", "")) == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        "[DONE]",
    ]


def test_usage_chunk_golden():
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11,
             "prompt_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
             "completion_tokens_details": {"reasoning_tokens": 0}}
    assert encode_stream(text_events("a", cached_tokens=6), include_usage=True) == [
        chunk({"role": "assistant", "content": ""}, usage=None),
        chunk({"content": "a"}, usage=None),
        chunk({}, "stop", usage=None),
        {**HEAD, "choices": [], "usage": usage},
        "[DONE]",
    ]


@pytest.mark.parametrize(
    ("reason", "wire_reason"),
    [(FinishReason.STOP, "stop"), (FinishReason.STOP_SEQUENCE, "stop"), (FinishReason.LENGTH, "length"),
     (FinishReason.TOOL_CALLS, "tool_calls")],
)
def test_finish_reasons(reason, wire_reason):
    frames = encode_stream([Finished(reason, Usage(1, 0))])
    assert frames[-2] == chunk({}, wire_reason)
    assert build([Finished(reason, Usage(1, 0))])["choices"][0]["finish_reason"] == wire_reason


def test_tool_call_stream_golden():
    events = tool_call_events("sh", '{"cmd":"ls"}', call_id="call_1", chunk=6, text="ok")
    assert encode_stream(events) == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "ok"}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "sh", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ':"ls"}'}}]}),
        chunk({}, "tool_calls"),
        "[DONE]",
    ]


def test_tool_call_end_sends_arguments_not_yet_streamed():
    events = [ToolCallStart(0, "call_1", "f"), ToolCallArgsDelta(0, '{"a"'), ToolCallEnd(0, '{"a":1}'),
              Finished(FinishReason.TOOL_CALLS, Usage(1, 1))]
    assert encode_stream(events)[3] == chunk({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})


def test_reasoning_delta_stream_and_message():
    events = [ReasoningDelta("think"), TextDelta("answer"), Finished(FinishReason.STOP, Usage(3, 2))]
    assert encode_stream(events)[1] == chunk({"reasoning_content": "think"})
    message = build(events)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "answer", "reasoning_content": "think"}


def test_error_finish_ends_with_error_frame_and_no_done():
    frames = encode_stream(error_events("partial", code="engine_error", message="out of memory"))
    assert frames[-1] == {"error": {"message": "out of memory", "type": "server_error", "param": None,
                                    "code": "engine_error"}}
    assert "[DONE]" not in frames


def test_abort_finish_just_ends():
    assert encode_stream([TextDelta("a"), Finished(FinishReason.ABORT, Usage(1, 1))])[-1] == chunk({"content": "a"})


def test_non_streaming_completion_golden():
    assert build(text_events("Hello", " world", cached_tokens=4)) == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "system_fingerprint": None,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello world"}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                  "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }


def test_non_streaming_tool_call_message():
    message = build(tool_call_events("sh", '{"cmd":"ls"}', call_id="call_1"))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd":"ls"}'}}]}


def test_non_streaming_error_and_abort_raise():
    with pytest.raises(ReportedError) as caught:
        build(error_events(code="engine_error", message="boom"))
    assert (caught.value.code, caught.value.message) == ("engine_error", "boom")
    with pytest.raises(Overloaded):
        build([Finished(FinishReason.ABORT, Usage(1, 0))])
