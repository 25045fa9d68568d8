"""`POST /v1/chat/completions`, `/v1/models` and `/health` on a real port, driven by the official openai SDK."""

from __future__ import annotations

import json
import urllib.request

from tests.support.fake_engine import FAKE_MODEL, text_events, tool_call_events
from zllm.api.auth import NAMESPACE_SECRET, namespace_for_key
from zllm.canonical import FinishReason, Message, TextDelta

USER = [{"role": "user", "content": "hi"}]


def test_non_streaming_completion(client, engine, server):
    engine.script(text_events("Hello", " world", prompt_tokens=12, cached_tokens=8))
    completion = client.chat.completions.create(model="fake-model", messages=USER, temperature=0, seed=3)
    assert completion.choices[0].message.content == "Hello world"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.usage.prompt_tokens == 12 and completion.usage.total_tokens == 14
    assert completion.usage.prompt_tokens_details.cached_tokens == 8
    request = engine.submitted[-1]
    assert request.messages == (Message("user", "hi"),)
    assert (request.sampling.temperature, request.sampling.seed, request.api) == (0.0, 3, "openai_chat")
    assert request.namespace == namespace_for_key("test-key", server.app[NAMESPACE_SECRET]) != ""
    assert engine.aborted == []


def test_streaming_text_with_usage_chunk(client, engine):
    engine.script(text_events("Hel", "lo", prompt_tokens=5, cached_tokens=2))
    chunks = list(client.chat.completions.create(
        model="fake-model", messages=USER, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (5, 2)
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_without_include_usage_has_no_usage_chunk(client, engine):
    chunks = list(client.chat.completions.create(model="fake-model", messages=USER, stream=True))
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_length_and_stop_sequence_finish_reasons(client, engine):
    engine.script(text_events("a", reason=FinishReason.LENGTH))
    engine.script(text_events("b", reason=FinishReason.STOP_SEQUENCE, stop_sequence="END"))
    first = client.chat.completions.create(model="fake-model", messages=USER, max_tokens=1)
    second = client.chat.completions.create(model="fake-model", messages=USER, stop="END", stream=True)
    assert first.choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in second][-1] == "stop"
    assert engine.submitted[0].sampling.max_tokens == 1
    assert engine.submitted[1].sampling.stop == ("END",)


TOOLS = [{"type": "function", "function": {
    "name": "sh", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]


def test_tool_call_deltas_reassembled_by_the_stream_helper(client, engine):
    arguments = json.dumps({"cmd": "ls -la /tmp"})
    engine.script(tool_call_events("sh", arguments, call_id="call_abc", chunk=3, text="Let me look."))
    with client.chat.completions.stream(model="fake-model", messages=USER, tools=TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_abc", "function", "sh")
    assert call.function.arguments == arguments
    assert engine.submitted[-1].tools[0].name == "sh"


def test_non_streaming_tool_call(client, engine):
    engine.script(tool_call_events("sh", '{"cmd":"pwd"}', call_id="call_1"))
    message = client.chat.completions.create(model="fake-model", messages=USER, tools=TOOLS,
                                             tool_choice="required").choices[0].message
    assert message.content is None
    assert message.tool_calls[0].function.arguments == '{"cmd":"pwd"}'


def test_tool_result_turn_round_trips(client, engine):
    messages = [
        {"role": "user", "content": "where am I?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "/home"},
    ]
    client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
    tool_message = engine.submitted[-1].messages[-1]
    assert (tool_message.role, tool_message.tool_call_id, tool_message.name) == ("tool", "call_1", "sh")


def test_engine_error_mid_stream_raises_in_the_sdk_and_ends(client, engine):
    from tests.support.fake_engine import error_events

    engine.script(error_events("partial ", code="engine_error", message="CUDA out of memory"))
    received = []
    try:
        for chunk in client.chat.completions.create(model="fake-model", messages=USER, stream=True):
            received.append(chunk)
    except Exception as exc:  # openai.APIError
        assert "CUDA out of memory" in str(exc)
        assert type(exc).__name__ == "APIError"
    else:
        raise AssertionError("the error frame did not surface")
    assert received[-1].choices[0].delta.content == "partial "


def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    model = client.models.retrieve("fake-model")
    assert (model.id, model.object, model.created, model.owned_by) == ("fake-model", "model", FAKE_MODEL.created,
                                                                        "zllm")


def test_model_ids_with_slashes(serve):
    from tests.support.fake_engine import FakeEngineClient
    from zllm.canonical import ModelCard

    server = serve(FakeEngineClient([ModelCard("org/model-1", 1, 2048)]))
    with urllib.request.urlopen(f"{server.url}/v1/models/org/model-1") as response:
        assert json.load(response)["id"] == "org/model-1"


def test_health_is_open_even_with_an_api_key(serve, engine):
    server = serve(engine, api_key="secret")
    with urllib.request.urlopen(f"{server.url}/health") as response:
        assert response.status == 200
        assert json.load(response) == {"status": "ok", "models": ["fake-model"]}


def test_keep_alive_comments_during_a_slow_first_event(serve, engine):
    engine.script([TextDelta("late"), *text_events()], delay=0.3)
    server = serve(engine, sse_heartbeat_s=0.05)
    body = json.dumps({"model": "fake-model", "messages": USER, "stream": True}).encode()
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        text = response.read().decode()
    assert ": keep-alive\n\n" in text
    assert text.rstrip().endswith("data: [DONE]")
