"""Golden tests: scripted canonical events → the exact Anthropic SSE bytes, and → one `message` object."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.fake_engine import error_events, text_events, tool_call_events
from tests.support.usage_merges import MERGES, fold, prompt_counted
from zllm.api.anthropic_messages.encode import MessagesStreamEncoder
from zllm.api.anthropic_messages.prompt_split import PromptSplit
from zllm.api.anthropic_messages.message import MessageBuilder
from zllm.api.anthropic_messages.signature import sign_thinking
from zllm.api.errors import ReportedError
from zllm.api.sse import encode_frame
from zllm.canonical import (
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from zllm.errors import Overloaded

START = (
    'event: message_start\n'
    'data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m",'
    '"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,'
    '"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}\n'
    '\n'
    'event: ping\n'
    'data: {"type":"ping"}\n'
    '\n'
)


def sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


def block_start(index: int, block: str) -> str:
    return sse("content_block_start", f'{{"type":"content_block_start","index":{index},"content_block":{block}}}')


def delta(index: int, body: str) -> str:
    return sse("content_block_delta", f'{{"type":"content_block_delta","index":{index},"delta":{body}}}')


def block_stop(index: int) -> str:
    return sse("content_block_stop", f'{{"type":"content_block_stop","index":{index}}}')


def end(stop_reason: str, usage: str, stop_sequence: str = "null") -> str:
    return (sse("message_delta", f'{{"type":"message_delta","delta":{{"stop_reason":"{stop_reason}",'
                                 f'"stop_sequence":{stop_sequence}}},"usage":{usage}}}')
            + sse("message_stop", '{"type":"message_stop"}'))


def out(output_tokens: int) -> str:
    """message_delta's usage: the output only (the input split stays message_start's)."""
    return f'{{"output_tokens":{output_tokens}}}'


def encoder() -> MessagesStreamEncoder:
    return MessagesStreamEncoder(message_id="msg_1", model="m", prompt_tokens=10)


def split_of(events) -> list:
    """What api/anthropic_messages/prompt_split.py puts first: the split the Finished repeats."""
    finished = next(e for e in events if isinstance(e, Finished))
    return [PromptSplit(replace(finished.usage, completion_tokens=0)), *events]


def stream_text(events, *, split: bool = True) -> str:
    enc = encoder()
    frames = enc.start()
    for event in split_of(events) if split else events:
        frames += enc.feed(event)
    return b"".join(encode_frame(f) for f in frames).decode()


def test_text_answer_golden():
    assert stream_text(text_events("Hel", "", "lo", cached_tokens=4)) == (
        'event: message_start\n'
        'data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m",'
        '"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":6,'
        '"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":0}}}\n'
        '\n'
        'event: ping\n'
        'data: {"type":"ping"}\n'
        '\n'
        'event: content_block_start\n'
        'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n'
        '\n'
        'event: content_block_delta\n'
        'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}\n'
        '\n'
        'event: content_block_delta\n'
        'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}\n'
        '\n'
        'event: content_block_stop\n'
        'data: {"type":"content_block_stop","index":0}\n'
        '\n'
        'event: message_delta\n'
        'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
        '"usage":{"output_tokens":3}}\n'
        '\n'
        'event: message_stop\n'
        'data: {"type":"message_stop"}\n'
        '\n'
    )


THINKING_EVENTS = [ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("Hi"),
                   Finished(FinishReason.STOP, Usage(10, 3))]


def test_thinking_then_text_golden():
    signature = "zllm1.-O75DQbMNEiWtvqvN0VBNAB1eej-hGx6yj__oFShrYU"  # pinned: echoed sessions depend on it
    assert signature == sign_thinking("m", "Let me think.")
    assert stream_text(THINKING_EVENTS) == START + (
        block_start(0, '{"type":"thinking","thinking":"","signature":""}')
        + delta(0, '{"type":"thinking_delta","thinking":"Let me "}')
        + delta(0, '{"type":"thinking_delta","thinking":"think."}')
        + delta(0, f'{{"type":"signature_delta","signature":"{signature}"}}')
        + block_stop(0)
        + block_start(1, '{"type":"text","text":""}')
        + delta(1, '{"type":"text_delta","text":"Hi"}')
        + block_stop(1)
        + end("end_turn", out(3))
    )


def test_tool_use_golden():
    events = tool_call_events("sh", '{"cmd":"ls"}', call_id="call_1", chunk=7, text="Let me look.")
    assert stream_text(events) == START + (
        block_start(0, '{"type":"text","text":""}')
        + delta(0, '{"type":"text_delta","text":"Let me look."}')
        + block_stop(0)
        + block_start(1, '{"type":"tool_use","id":"toolu_1","name":"sh","input":{}}')
        + delta(1, '{"type":"input_json_delta","partial_json":"{\\"cmd\\":"}')
        + delta(1, '{"type":"input_json_delta","partial_json":"\\"ls\\"}"}')
        + block_stop(1)
        + end("tool_use", out(4))
    )


def test_tool_use_ids_are_the_core_ids_and_late_arguments_are_streamed_at_the_end():
    events = [ToolCallStart(0, "call_1", "a"), ToolCallEnd(0, '{"x":1}'),
              ToolCallStart(1, "call_2", "a"), ToolCallEnd(1, "{}"),
              Finished(FinishReason.TOOL_CALLS, Usage(10, 9))]
    assert stream_text(events) == START + (
        block_start(0, '{"type":"tool_use","id":"toolu_1","name":"a","input":{}}')
        + delta(0, '{"type":"input_json_delta","partial_json":"{\\"x\\":1}"}')
        + block_stop(0)
        + block_start(1, '{"type":"tool_use","id":"toolu_2","name":"a","input":{}}')
        + delta(1, '{"type":"input_json_delta","partial_json":"{}"}')
        + block_stop(1)
        + end("tool_use", out(9))
    )


def test_max_tokens_golden():
    assert stream_text(text_events("a", reason=FinishReason.LENGTH)) == START + (
        block_start(0, '{"type":"text","text":""}') + delta(0, '{"type":"text_delta","text":"a"}') + block_stop(0)
        + end("max_tokens", out(1))
    )


def test_stop_sequence_golden():
    events = text_events("a", reason=FinishReason.STOP_SEQUENCE, stop_sequence="END")
    assert stream_text(events) == START + (
        block_start(0, '{"type":"text","text":""}') + delta(0, '{"type":"text_delta","text":"a"}') + block_stop(0)
        + end("stop_sequence", out(1), stop_sequence='"END"')
    )


def test_error_mid_stream_golden():
    assert stream_text(error_events("partial", message="CUDA out of memory")) == START + (
        block_start(0, '{"type":"text","text":""}') + delta(0, '{"type":"text_delta","text":"partial"}')
        + sse("error", '{"type":"error","error":{"type":"api_error","message":"CUDA out of memory"}}')
    )
    overloaded = stream_text(error_events(code="overloaded", message="shutting down"))
    assert overloaded == START + sse(
        "error", '{"type":"error","error":{"type":"overloaded_error","message":"shutting down"}}')


def test_abort_ends_without_message_stop():
    events = [TextDelta("par"), Finished(FinishReason.ABORT, Usage(10, 1))]
    assert stream_text(events) == START + block_start(0, '{"type":"text","text":""}') + delta(
        0, '{"type":"text_delta","text":"par"}')


def test_every_frame_names_its_event():
    text = stream_text([*THINKING_EVENTS[:-1], *tool_call_events("sh", '{"a":1}')])
    frames = [frame for frame in text.split("\n\n") if frame]
    assert frames and all(frame.startswith("event: ") and "\ndata: " in frame for frame in frames)


# ----------------------------------------------------------------------------------------------------------
# non-streaming


def build(events, *, split: bool = True) -> dict:
    builder = MessageBuilder(encoder())
    for event in split_of(events) if split else events:
        builder.feed(event)
    return builder.result()


def test_message_object_golden():
    events = [*THINKING_EVENTS[:-1], *tool_call_events("sh", '{"cmd":"ls"}', call_id="call_1", prompt_tokens=10)]
    assert build(events) == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "thinking", "thinking": "Let me think.", "signature": sign_thinking("m", "Let me think.")},
            {"type": "text", "text": "Hi"},
            {"type": "tool_use", "id": "toolu_1", "name": "sh", "input": {"cmd": "ls"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 5},
    }


def test_message_stop_sequence_and_unparseable_tool_input():
    assert build(text_events("a", reason=FinishReason.STOP_SEQUENCE, stop_sequence="END"))["stop_sequence"] == "END"
    message = build(tool_call_events("sh", '{"cmd": oops'))
    assert message["content"][0]["input"] == {}


def test_message_errors_raise():
    with pytest.raises(ReportedError) as caught:
        build(error_events(message="CUDA out of memory"))
    assert (caught.value.code, caught.value.message) == ("engine_error", "CUDA out of memory")
    with pytest.raises(Overloaded):
        build([Finished(FinishReason.ABORT, Usage(10, 0))])


# ----------------------------------------------------------------------------------------------------------
# usage: the prompt counted once however a client merges message_start and message_delta


SPLITS = {  # Usage(prompt, output, cached, cache_write): what the runtime reports
    "cold, kept": Usage(10, 3, 0, cache_write_tokens=10),
    "device hit": Usage(10, 3, 9, cache_write_tokens=1),
    "cache off": Usage(10, 3, 0, cache_write_tokens=0),
    "partly read, rest kept": Usage(10, 3, 4, cache_write_tokens=6),
}


@pytest.mark.parametrize("merge", sorted(MERGES))
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_every_merge_counts_the_prompt_once_and_keeps_the_split(merge: str, split: str):
    usage = SPLITS[split]
    frames = [frame.data for frame in frames_of([TextDelta("hi"), Finished(FinishReason.STOP, usage)])]
    folded = fold(MERGES[merge], frames)
    assert prompt_counted(folded) == usage.prompt_tokens
    assert (folded["cache_read_input_tokens"], folded["cache_creation_input_tokens"]) == (
        usage.cached_tokens, usage.cache_write_tokens)
    assert folded["output_tokens"] == usage.completion_tokens


def test_message_start_waits_for_the_split_and_a_stream_without_one_starts_at_its_end():
    enc = encoder()
    assert enc.start() == []  # nothing until the cache has answered
    [start, ping] = enc.feed(PromptSplit(Usage(10, 0, 7, cache_write_tokens=3)))
    assert start.data["message"]["usage"] == {"input_tokens": 0, "cache_creation_input_tokens": 3,
                                              "cache_read_input_tokens": 7, "output_tokens": 0}
    assert ping.event == "ping" and enc.feed(PromptSplit(Usage(10, 0))) == []  # one message_start only
    # no split at all (a stream that ended before the engine answered): message_start from the Finished usage
    frames = [f.data for f in frames_of([Finished(FinishReason.STOP, Usage(10, 2, 6, cache_write_tokens=4))],
                                        split=False)]
    assert [f["type"] for f in frames] == ["message_start", "ping", "message_delta", "message_stop"]
    assert all(prompt_counted(fold(merge, frames)) == 10 for merge in MERGES.values())


def test_the_message_object_has_the_split_of_message_start():
    usage = Usage(10, 3, 4, cache_write_tokens=6)
    message = build([TextDelta("hi"), Finished(FinishReason.STOP, usage)])
    assert message["usage"] == {"input_tokens": 0, "cache_creation_input_tokens": 6, "cache_read_input_tokens": 4,
                                "output_tokens": 3}


def frames_of(events, *, split: bool = True) -> list:
    enc = encoder()
    frames = enc.start()
    for event in split_of(events) if split else events:
        frames += enc.feed(event)
    return frames
