"""Heartbeat events on idle streams (api/stream_pump.py): each API sends its own while no event comes, at the interval,
and the real SDKs end up with the same answer and usage as without them.

The fake engine waits before each event (a slow prefill before the first, slow tokens after), so heartbeats
fall before any content, inside a text block and inside a tool call; the same script runs with heartbeat events
off for the reference.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request

import anthropic
import pytest

from tests.support.fake_engine import tool_call_events
from zllm.api.anthropic_messages.encode import MessagesStreamEncoder, heartbeat_delta
from zllm.api.anthropic_messages.prompt_split import PromptSplit
from zllm.api.openai_chat.encode import ChatStreamEncoder
from zllm.canonical import Finished, FinishReason, TextDelta, Usage

DELAY_S = 0.15  # before each scripted event
COMMENT_S, EVENT_S = 0.03, 0.06
USER = [{"role": "user", "content": "hi"}]


def script(engine) -> None:
    engine.script(tool_call_events("sh", '{"cmd":"ls -la"}', text="Let me look.", prompt_tokens=10), delay=DELAY_S)


def served(serve, engine, heartbeats: bool):
    script(engine)
    return serve(engine, sse_heartbeat_s=COMMENT_S, sse_event_heartbeat_s=EVENT_S if heartbeats else None)


def claude_code_merge(usages: list[dict]) -> dict:
    """How Claude Code 2.1.197 folds message_start's usage and each message_delta's: an input or cache field
    of a delta counts only above 0, output_tokens whenever present."""
    merged = dict(usages[0])
    for usage in usages[1:]:
        for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            if (usage.get(field) or 0) > 0:
                merged[field] = usage[field]
        if usage.get("output_tokens") is not None:
            merged["output_tokens"] = usage["output_tokens"]
    return merged


def messages_run(server) -> tuple[list, dict, dict]:
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=10)
    with client.messages.stream(model="fake-model", max_tokens=64, messages=USER) as stream:
        events = []
        for event in stream:
            events.append(event)
            if event.type == "message_start":
                start_usage = event.message.usage.model_dump()
            elif event.type == "message_delta" and event.delta.stop_reason is None:
                # a heartbeat: the snapshot still says what message_start said (the last delta may leave
                # input and cache fields out, so a heartbeat's value there would stick)
                assert stream.current_message_snapshot.usage.model_dump() == start_usage
        final = stream.get_final_message().model_dump(exclude={"id"})
    usages = [e.message.usage.model_dump() for e in events if e.type == "message_start"]
    usages += [e.usage.model_dump(exclude_none=True) for e in events if e.type == "message_delta"]
    return events, final, claude_code_merge(usages)


def test_messages_heartbeats_change_nothing_the_sdk_or_claude_code_accumulates(serve, engine) -> None:
    events, final, merged = messages_run(served(serve, engine, heartbeats=True))
    _, reference, reference_merged = messages_run(served(serve, engine, heartbeats=False))
    assert final == reference and merged == reference_merged
    assert final["usage"]["input_tokens"] == 10 and final["stop_reason"] == "tool_use"
    kinds = [e.type for e in events]
    first_block = kinds.index("content_block_start")
    beats = [e for e in events[:first_block] if e.type == "message_delta"]
    assert beats and all(e.delta.stop_reason is None for e in beats)  # during the "prefill"
    empty = [e.delta for e in events if e.type == "content_block_delta" and
             (getattr(e.delta, "text", None) == "" or getattr(e.delta, "partial_json", None) == "")]
    assert {d.type for d in empty} == {"text_delta", "input_json_delta"}  # inside each kind of open block


def test_chat_heartbeats_are_empty_content_chunks_the_sdk_folds_away(serve, engine, make_client) -> None:
    def run(server) -> tuple[list, dict]:
        with make_client(server).chat.completions.stream(model="fake-model", messages=USER) as stream:
            chunks = [e.chunk for e in stream if e.type == "chunk"]
            final = stream.get_final_completion()
        return chunks, final.model_dump(include={"choices", "usage", "model"})

    chunks, final = run(served(serve, engine, heartbeats=True))
    reference_chunks, reference = run(served(serve, engine, heartbeats=False))
    assert final == reference and final["choices"][0]["message"]["content"] == "Let me look."
    empty = [c for c in chunks[1:] if c.choices and c.choices[0].delta.content == ""]
    assert len(empty) >= 2 and len(chunks) == len(reference_chunks) + len(empty)


def test_responses_heartbeats_repeat_in_progress_and_keep_the_sequence(serve, engine, make_client) -> None:
    def run(server) -> tuple[list, dict]:
        with make_client(server).responses.stream(model="fake-model", input="hi") as stream:
            events = list(stream)
            response = stream.get_final_response()
        output = [{k: v for k, v in item.model_dump().items() if k not in ("id",)} for item in response.output]
        return events, {"output": output, "usage": response.usage.model_dump(), "status": response.status}

    events, final = run(served(serve, engine, heartbeats=True))
    _, reference = run(served(serve, engine, heartbeats=False))
    assert final == reference
    assert sum(e.type == "response.in_progress" for e in events) >= 3
    numbers = [e.sequence_number for e in events if hasattr(e, "sequence_number")]
    assert numbers == list(range(len(numbers)))


def raw_frames(server, path: str, body: dict) -> list[tuple[float, str]]:
    """(arrival time, frame text) of each SSE frame, comments included."""
    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    frames, lines = [], []
    with urllib.request.urlopen(request, timeout=10) as response:
        for raw in response:
            line = raw.decode()
            if line == "\n":
                frames.append((time.monotonic(), "".join(lines)))
                lines = []
            else:
                lines.append(line)
    return frames


def test_heartbeat_events_come_at_their_interval_and_comments_between(serve, engine) -> None:
    engine.script([TextDelta("late"), Finished(FinishReason.STOP, Usage(10, 1))], delay=0.5)
    server = serve(engine, sse_heartbeat_s=0.05, sse_event_heartbeat_s=0.2)
    frames = raw_frames(server, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": USER,
                                                 "stream": True})
    start = next(t for t, text in frames if "message_start" in text)
    beats = [t for t, text in frames if '"stop_reason":null' in text and "message_delta" in text]
    assert len(beats) == 2  # 0.2 s and 0.4 s into the 0.5 s wait
    gaps = [b - a for a, b in itertools.pairwise([start, *beats])]
    assert all(0.15 < gap < 0.35 for gap in gaps), gaps
    assert sum(text == ": keep-alive\n" for _, text in frames) >= 4  # the 0.05 s comments go on between


def test_without_heartbeat_events_only_comments_fill_the_wait(serve, engine) -> None:
    engine.script([TextDelta("late"), Finished(FinishReason.STOP, Usage(10, 1))], delay=0.3)
    server = serve(engine, sse_heartbeat_s=0.05, sse_event_heartbeat_s=None)
    frames = raw_frames(server, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": USER,
                                                 "stream": True})
    assert sum("message_delta" in text for _, text in frames) == 1  # the last one only
    assert any(text == ": keep-alive\n" for _, text in frames)


def test_no_heartbeat_before_message_start_or_after_the_end() -> None:
    encoder = MessagesStreamEncoder(message_id="msg_1", model="m", prompt_tokens=10)
    assert encoder.heartbeat() == []  # no event may come before message_start
    encoder.start()
    assert encoder.heartbeat() == []  # message_start waits for the prompt's split
    encoder.feed(PromptSplit(Usage(10, 0)))
    assert [f.data for f in encoder.heartbeat()] == [heartbeat_delta()]
    encoder.feed(Finished(FinishReason.STOP, Usage(10, 0)))
    assert encoder.heartbeat() == []
    chat = ChatStreamEncoder(completion_id="c", model="m", created=1, include_usage=True)
    chat.start()
    assert chat.heartbeat()[0]["choices"][0]["delta"] == {"content": ""}
    chat.feed(Finished(FinishReason.STOP, Usage(10, 0)))
    assert chat.heartbeat() == []


def test_the_messages_heartbeat_carries_no_input_or_cache_usage() -> None:
    # another message_delta value of these would override message_start's split in the SDKs
    assert heartbeat_delta()["usage"] == {"output_tokens": 0}
    assert heartbeat_delta()["delta"] == {"stop_reason": None, "stop_sequence": None}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_openai_streams_get_heartbeat_events_too(serve, engine, path: str) -> None:
    engine.script([TextDelta("late"), Finished(FinishReason.STOP, Usage(10, 1))], delay=0.3)
    server = serve(engine, sse_heartbeat_s=0.05, sse_event_heartbeat_s=0.1)
    body = ({"model": "fake-model", "messages": USER, "stream": True} if "chat" in path else
            {"model": "fake-model", "input": "hi", "stream": True})
    texts = [text for _, text in raw_frames(server, path, body)]
    marker = '"delta":{"content":""}' if "chat" in path else "event: response.in_progress"
    assert sum(marker in text for text in texts) >= 3  # the start's own, then at least two heartbeats
