"""Golden tests: scripted canonical events → the exact Responses stream events (SSE and WebSocket share them)."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.support.fake_engine import error_events, text_events, tool_call_events
from zllm.api.errors import describe_code
from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.items import decode_input, encode_reasoning
from zllm.api.openai_responses.response_object import response_shell
from zllm.api.openai_responses.routes import SseEvents
from zllm.api.openai_responses.tools import decode_tools
from zllm.api.sse import encode_frame
from zllm.canonical import (
    Finished,
    FinishReason,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    Usage,
)

SHELL = response_shell("resp_1", model="m", created_at=100, echo={"store": False})
USAGE = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 2,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}
TOOLS = decode_tools([
    ({"type": "function", "name": "sh"}, "tools[0]"),
    ({"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]}, "tools[1]"),
    ({"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                          "definition": "start: x"}}, "tools[2]"),
])


def counting_mint():
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter)}"


def encoder(**options) -> ResponseEventEncoder:
    return ResponseEventEncoder(SHELL, TOOLS, mint=counting_mint(), clock=lambda: 200, **options)


def run(events, **options) -> list[dict]:
    enc = encoder(**options)
    frames = enc.start()
    for event in events:
        frames += enc.feed(event)
    return frames


def without_sequence(frames: list[dict]) -> list[dict]:
    return [{k: v for k, v in frame.items() if k != "sequence_number"} for frame in frames]


def in_progress() -> dict:
    return {**SHELL, "output": []}


def test_text_answer_golden():
    message = {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    done_item = {**message, "status": "completed", "content": [part]}
    where = {"item_id": "msg_1", "output_index": 0}
    frames = run(text_events("Hel", "lo"))
    assert without_sequence(frames) == [
        {"type": "response.created", "response": in_progress()},
        {"type": "response.in_progress", "response": in_progress()},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.content_part.added", **where, "content_index": 0, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **where, "content_index": 0, "delta": "Hel", "logprobs": []},
        {"type": "response.output_text.delta", **where, "content_index": 0, "delta": "lo", "logprobs": []},
        {"type": "response.output_text.done", **where, "content_index": 0, "text": "Hello", "logprobs": []},
        {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": {**SHELL, "status": "completed", "output": [done_item],
                                                    "usage": USAGE, "completed_at": 200}},
    ]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))


def test_reasoning_then_text_golden():
    frames = run([ReasoningDelta("let me "), ReasoningDelta("think"), TextDelta("ok"),
                  Finished(FinishReason.STOP, Usage(10, 3))], encrypted_reasoning=True)
    assert [f["type"] for f in frames] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]
    assert frames[2]["item"] == {"type": "reasoning", "id": "rs_1", "summary": []}
    assert frames[3] == {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0,
                         "summary_index": 0, "part": {"type": "summary_text", "text": ""}, "sequence_number": 3}
    assert frames[6]["text"] == "let me think"
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "let me think"}],
                 "encrypted_content": encode_reasoning("let me think")}
    assert frames[8]["item"] == reasoning
    assert frames[9]["output_index"] == 1 and frames[9]["item"]["id"] == "msg_2"
    completed = frames[-1]["response"]
    assert completed["output"][0] == reasoning and completed["output"][1]["content"][0]["text"] == "ok"
    assert completed["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


def test_function_call_with_argument_deltas_golden():
    frames = run(tool_call_events("agents.spawn", '{"task":"x"}', chunk=5, call_id="call_0f3a"))
    added = {"type": "function_call", "id": "fc_1", "status": "in_progress", "call_id": "call_0f3a",
             "name": "spawn", "arguments": "", "namespace": "agents"}
    where = {"item_id": "fc_1", "output_index": 0}
    done = {**added, "status": "completed", "arguments": '{"task":"x"}'}
    assert without_sequence(frames[2:-1]) == [
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        {"type": "response.function_call_arguments.delta", **where, "delta": '{"tas'},
        {"type": "response.function_call_arguments.delta", **where, "delta": 'k":"x'},
        {"type": "response.function_call_arguments.delta", **where, "delta": '"}'},
        {"type": "response.function_call_arguments.done", **where, "arguments": '{"task":"x"}'},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    assert frames[-1]["type"] == "response.completed" and frames[-1]["response"]["output"] == [done]


def test_arguments_known_only_at_the_end_are_sent_as_one_delta():
    from zllm.canonical import ToolCallEnd, ToolCallStart

    frames = run([ToolCallStart(0, "x", "sh"), ToolCallEnd(0, '{"a":1}'), Finished(FinishReason.TOOL_CALLS,
                                                                                     Usage(1, 1))])
    deltas = [f["delta"] for f in frames if f["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"a":1}']


def test_custom_tool_call_golden():
    frames = run(tool_call_events("apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"})))
    body = [f for f in frames[2:-1]]
    assert [f["type"] for f in body] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                                         "response.custom_tool_call_input.done", "response.output_item.done"]
    assert body[0]["item"] == {"type": "custom_tool_call", "id": "ctc_1", "status": "in_progress",
                               "call_id": "call_fake0", "name": "apply_patch", "input": ""}
    assert body[1]["delta"] == body[2]["input"] == "*** Begin Patch\n*** End Patch"
    assert body[3]["item"]["input"] == "*** Begin Patch\n*** End Patch"


def test_max_tokens_is_response_incomplete():
    frames = run(text_events("a", "b", reason=FinishReason.LENGTH))
    assert [f["type"] for f in frames[-2:]] == ["response.output_item.done", "response.incomplete"]
    assert frames[-2]["item"]["status"] == "incomplete"
    response = frames[-1]["response"]
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert "completed_at" not in response and response["usage"]["output_tokens"] == 2


def test_engine_error_is_response_failed():
    frames = run(error_events("partial", code="context_length_exceeded", message="prompt is too long"))
    failed = frames[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "context_length_exceeded", "message": "prompt is too long"}
    assert failed["response"]["output"][0]["content"][0]["text"] == "partial"
    oom = run(error_events(code="engine_error", message="CUDA out of memory"))[-1]
    assert oom["response"]["error"]["code"] == "server_error"


def test_fail_reports_a_pump_error_in_stream():
    enc = encoder()
    enc.start()
    (failed,) = enc.fail(describe_code("internal_error", "boom"))
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 2
    assert failed["response"]["error"] == {"code": "server_error", "message": "boom"}


def test_abort_ends_without_a_terminal_event_and_is_not_recorded():
    recorded = []
    frames = run([TextDelta("a"), Finished(FinishReason.ABORT, Usage(1, 1))], on_finish=recorded.append)
    assert frames[-1]["type"] == "response.output_text.delta" and recorded == []


def test_on_finish_sees_the_final_response_before_the_terminal_event():
    recorded = []
    enc = encoder(on_finish=recorded.append)
    enc.start()
    frames = enc.feed(TextDelta("hi"))
    assert recorded == []
    frames = enc.feed(Finished(FinishReason.STOP, Usage(1, 1)))
    assert recorded == [frames[-1]["response"]]


def test_prewarm_is_created_then_completed_with_no_output():
    frames = encoder().prewarm()
    assert [(f["type"], f["sequence_number"]) for f in frames] == [("response.created", 0), ("response.completed", 1)]
    assert frames[1]["response"]["output"] == [] and frames[1]["response"]["usage"]["total_tokens"] == 0


@pytest.mark.parametrize("events", [
    text_events("a"), tool_call_events("sh", "{}"), error_events("x"), text_events("a", reason=FinishReason.LENGTH),
    [ReasoningDelta("r"), *tool_call_events("sh", "{}", index=0), ],
])
def test_sequence_numbers_count_from_zero(events):
    frames = run(events)
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))


def test_sse_frames_are_named_by_their_type():
    sse = SseEvents(encoder())
    first = encode_frame(sse.start()[0]).decode()
    assert first.startswith("event: response.created\ndata: {\"type\":\"response.created\"")


def test_output_reads_back_as_the_same_canonical_messages_a_client_echo_gives():
    frames = run([ReasoningDelta("plan"), TextDelta("Let me look."),
                  *tool_call_events("agents.spawn", "{}"), ])
    output = frames[-1]["response"]["output"]
    call_id = output[2]["call_id"]
    assert decode_input(output).messages == (
        Message("assistant", "Let me look.", reasoning="plan",
                tool_calls=(ToolCall(call_id, "agents.spawn", "{}"),)),
    )
