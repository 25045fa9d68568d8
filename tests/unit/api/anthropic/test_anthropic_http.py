"""`POST /v1/messages`, count_tokens and `/v1/models` on a real port, driven by the official anthropic SDK."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

from tests.support.fake_engine import FAKE_MODEL, text_events, tool_call_events
from zllm.api.auth import NAMESPACE_SECRET, namespace_for_key
from zllm.canonical import (
    Finished,
    FinishReason,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    Usage,
)

MODEL = FAKE_MODEL.id
USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"name": "sh", "description": "run a shell command",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}]
ARGUMENTS = json.dumps({"cmd": "ls -la /tmp"})
THINK_TEXT_TOOL = [ReasoningDelta("The user wants "), ReasoningDelta("a listing."), TextDelta("Let me look."),
                   *tool_call_events("sh", ARGUMENTS, chunk=5, prompt_tokens=12)]


def post(server, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, dict(response.headers), response.read()


def test_non_streaming_message(claude, engine, server):
    engine.script(text_events("Hello", " world", prompt_tokens=12, cached_tokens=8))
    message = claude.messages.create(model=MODEL, max_tokens=64, messages=USER,
                                     extra_body={"temperature": 0, "top_k": 5})  # SDK 2.14 dropped them
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello world"
    assert (message.stop_reason, message.stop_sequence, message.role) == ("end_turn", None, "assistant")
    assert message.id.startswith("msg_") and message.model == MODEL
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
            usage.output_tokens) == (4, 8, 0, 2)
    request = engine.submitted[-1]
    assert request.messages == (Message("user", "hi"),)
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.max_tokens) == (0.0, 5, 64)
    namespace = namespace_for_key("test-key", server.app[NAMESPACE_SECRET])
    assert (request.api, request.namespace) == ("anthropic_messages", namespace)


def test_streaming_create_yields_every_event(claude, engine):
    engine.script(THINK_TEXT_TOOL)
    events = list(claude.messages.create(model=MODEL, max_tokens=64, messages=USER, tools=TOOLS, stream=True))
    assert [event.type for event in events] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", *["content_block_delta"] * 5, "content_block_stop",
        "message_delta", "message_stop",
    ]
    # message_start: the prompt's split (the script's usage); message_delta: the output only, the split stays
    assert (events[0].message.usage.input_tokens, events[-2].usage.input_tokens) == (12, None)
    assert events[-2].usage.output_tokens > 0
    assert events[-2].delta.stop_reason == "tool_use"


def test_stream_helper_final_message_with_thinking_text_and_tool_use(claude, engine):
    engine.script(THINK_TEXT_TOOL)
    with claude.messages.stream(model=MODEL, max_tokens=64, messages=USER, tools=TOOLS) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Let me look."
    thinking, answer, tool_use = final.content
    assert (thinking.type, thinking.thinking) == ("thinking", "The user wants a listing.")
    assert thinking.signature.startswith("zllm1.")
    assert (answer.type, answer.text) == ("text", "Let me look.")
    assert (tool_use.type, tool_use.name, tool_use.input) == ("tool_use", "sh", json.loads(ARGUMENTS))
    assert tool_use.id.startswith("toolu_")
    assert final.stop_reason == "tool_use"


def test_tool_result_turn_echoes_thinking_and_ids(claude, engine):
    engine.script(THINK_TEXT_TOOL)
    first = claude.messages.create(model=MODEL, max_tokens=64, messages=USER, tools=TOOLS)
    tool_use = first.content[2]
    claude.messages.create(model=MODEL, max_tokens=64, tools=TOOLS, messages=[
        *USER,
        {"role": "assistant", "content": [block.to_dict() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "a.txt"}]},
    ])
    request = engine.submitted[-1]
    assert request.messages[1:] == (
        Message("assistant", "Let me look.", reasoning="The user wants a listing.",
                tool_calls=(ToolCall(tool_use.id, "sh", '{"cmd":"ls -la /tmp"}'),)),
        Message("tool", "a.txt", tool_call_id=tool_use.id, name="sh"),
    )


def test_stop_sequence_and_max_tokens(claude, engine):
    engine.script(text_events("a", reason=FinishReason.STOP_SEQUENCE, stop_sequence="END"))
    engine.script(text_events("b", reason=FinishReason.LENGTH))
    first = claude.messages.create(model=MODEL, max_tokens=5, messages=USER, stop_sequences=["END"])
    with claude.messages.stream(model=MODEL, max_tokens=1, messages=USER) as stream:
        second = stream.get_final_message()
    assert (first.stop_reason, first.stop_sequence) == ("stop_sequence", "END")
    assert (second.stop_reason, second.stop_sequence) == ("max_tokens", None)
    assert engine.submitted[0].sampling.stop == ("END",)


def test_beta_query_and_both_auth_headers(serve, engine):
    server = serve(engine, api_key="secret")
    body = {"model": MODEL, "max_tokens": 8, "messages": USER, "stream": True}
    for auth in ({"x-api-key": "secret"}, {"Authorization": "Bearer secret"}):
        status, headers, raw = post(server, "/v1/messages?beta=true", body,
                                    {**auth, "anthropic-version": "2023-06-01", "anthropic-beta": "made-up-2099"})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        frames = [frame for frame in raw.decode().split("\n\n") if frame]
        # data-only SSE is silently empty for the SDK: every frame must name its event
        assert all(frame.startswith("event: ") for frame in frames), frames
        assert frames[-1] == 'event: message_stop\ndata: {"type":"message_stop"}'
    status, _, raw = post(server, "/v1/messages/count_tokens?beta=true", {"model": MODEL, "messages": USER},
                          {"x-api-key": "secret"})
    assert (status, json.loads(raw)) == (200, {"input_tokens": 5})


def test_count_tokens_counts_what_generation_submits(claude, engine):
    body = {"model": MODEL, "system": "be brief", "tools": TOOLS,
            "messages": [{"role": "user", "content": "one two three"}]}
    counted = claude.messages.count_tokens(**body)
    events = list(claude.messages.create(**body, max_tokens=4, stream=True))
    # the fake engine counts 4 + words per message: system 6, user 7
    assert counted.input_tokens == events[0].message.usage.input_tokens == 13


def test_models_in_anthropic_shape(claude):
    page = claude.models.list()
    (model,) = page.data
    assert (model.id, model.type, model.display_name, model.max_input_tokens) == (MODEL, "model", MODEL, 8192)
    assert model.created_at.isoformat() == "2023-11-14T22:13:20+00:00"
    assert (page.has_more, page.first_id, page.last_id) == (False, MODEL, MODEL)
    assert claude.models.retrieve(MODEL).id == MODEL


def test_models_without_anthropic_version_stay_openai_shaped(server):
    with urllib.request.urlopen(f"{server.url}/v1/models") as response:
        assert json.load(response)["object"] == "list"
    request = urllib.request.Request(f"{server.url}/v1/models?limit=1000", headers={"anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request) as response:
        assert json.load(response) == {
            "data": [{"type": "model", "id": MODEL, "display_name": MODEL, "created_at": "2023-11-14T22:13:20Z",
                      "lifecycle": "active", "max_input_tokens": 8192, "max_tokens": 8192}],
            "has_more": False, "first_id": MODEL, "last_id": MODEL}


def test_late_thinking_after_text_opens_a_new_block(claude, engine):
    engine.script([TextDelta("a"), ReasoningDelta("b"), TextDelta("c"), Finished(FinishReason.STOP, Usage(3, 3))])
    message = claude.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert [block.type for block in message.content] == ["text", "thinking", "text"]


def test_hang_up_mid_stream_aborts_the_engine_request(server, engine):
    engine.script(text_events(*[f"tok{i} " for i in range(400)]), delay=0.02)
    payload = json.dumps({"model": MODEL, "max_tokens": 999, "messages": USER, "stream": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        received = b""
        while b'"text":"tok1 "' not in received:
            data = sock.recv(4096)
            assert data, received
            received += data
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.aborted == [engine.submitted[0].id]
