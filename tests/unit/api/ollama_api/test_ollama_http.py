"""The Ollama routes on a real port over the fake engine, driven by the official `ollama` client package."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import ollama
import pytest

from tests.support.fake_engine import FAKE_MODEL, error_events, text_events, tool_call_events
from zllm.api.auth import NAMESPACE_SECRET, namespace_for_key
from zllm.api.ollama import wire
from zllm.canonical import FunctionTool, Message, ReasoningDelta, TextDelta, ToolCall
from zllm.canonical.events import Finished
from zllm.canonical.finish import FinishReason, Usage
from zllm.errors import Overloaded

MODEL = FAKE_MODEL.id
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": "Bearer test-key"}, timeout=10)


def raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(f"{server.url}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def test_chat_not_streaming(client, engine, server):
    engine.script(text_events("Hello", " world", prompt_tokens=12, cached_tokens=8))
    answer = client.chat(model=MODEL, messages=USER, stream=False,
                         options={"temperature": 0, "seed": 3, "top_k": 5, "top_p": 0.5, "num_predict": 7,
                                  "stop": ["\n\n"], "num_ctx": 4096, "repeat_penalty": 1.1}, keep_alive="5m")
    assert answer.message.role == "assistant" and answer.message.content == "Hello world"
    assert answer.done and answer.done_reason == "stop"
    assert (answer.prompt_eval_count, answer.eval_count) == (12, 2)
    assert answer.total_duration >= answer.prompt_eval_duration + answer.eval_duration - 1 > 0
    assert answer.load_duration == 0 and answer.model == MODEL
    request = engine.submitted[-1]
    assert request.messages == (Message("user", "hi"),) and request.api == "ollama"
    sampling = request.sampling
    assert (sampling.temperature, sampling.seed, sampling.top_k, sampling.top_p) == (0.0, 3, 5, 0.5)
    assert (sampling.max_tokens, sampling.stop) == (7, ("\n\n",))
    assert request.namespace == namespace_for_key("test-key", server.app[NAMESPACE_SECRET])


def test_chat_streams_ndjson_by_default(server, client, engine):
    engine.script([ReasoningDelta("hmm"), *text_events("Hel", "lo", prompt_tokens=9, cached_tokens=4)])
    chunks = list(client.chat(model=MODEL, messages=USER, stream=True))
    assert [c.message.thinking for c in chunks[:1]] == ["hmm"]
    assert "".join(c.message.content for c in chunks) == "Hello"
    assert [c.done for c in chunks] == [False, False, False, True]
    assert chunks[-1].done_reason == "stop" and chunks[-1].prompt_eval_count == 9
    # without `stream` the server streams (Ollama's default), one JSON object per line
    request = urllib.request.Request(f"{server.url}/api/chat", method="POST",
                                     data=json.dumps({"model": MODEL, "messages": USER}).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith(wire.NDJSON)
        lines = response.read().decode().splitlines()
    last = json.loads(lines[-1])
    assert last["done"] is True and last["zllm"] == {"cached_tokens": 0}
    assert [json.loads(line)["message"]["content"] for line in lines[:-1]] == ["Hello", " world"]


def test_tool_calls_have_object_arguments(client, engine):
    engine.script(tool_call_events("get_weather", '{"city":"paris","days":2}', call_id="call_7"))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    chunks = list(client.chat(model=MODEL, messages=USER, tools=tools, stream=True))
    calls = [call for chunk in chunks for call in (chunk.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather",
                                                                               {"city": "paris", "days": 2})]
    assert chunks[-1].done_reason == "stop"
    assert engine.submitted[-1].tools == (FunctionTool("get_weather", "Weather", tools[0]["function"]["parameters"]),)
    # the client sends `required` before `properties`; the prompt gets the order OpenAI-style clients write
    assert list(engine.submitted[-1].tools[0].parameters) == ["type", "properties", "required"]
    engine.script(tool_call_events("get_weather", '{"city":"rome"}'))
    answer = client.chat(model=MODEL, messages=USER, tools=tools, stream=False)
    assert [dict(c.function.arguments) for c in answer.message.tool_calls] == [{"city": "rome"}]


def test_tool_history_decodes_like_chat_completions(client, engine):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "thinking": "look it up",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "paris", "days": 2}}},
                        {"function": {"name": "search", "arguments": {"query": "paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
        {"role": "tool", "content": "lots"},
    ]
    client.chat(model=MODEL, messages=messages, stream=False)
    sent = engine.submitted[-1].messages
    assert sent[2] == Message("assistant", "", reasoning="look it up", tool_calls=(
        ToolCall("call_0", "get_weather", '{"city":"paris","days":2}'),
        ToolCall("call_1", "search", '{"query":"paris"}')))
    # results answer the turn's calls in order when the client names no call id
    assert sent[3] == Message("tool", "sunny", tool_call_id="call_0", name="get_weather")
    assert sent[4] == Message("tool", "lots", tool_call_id="call_1", name="search")


def test_format_and_think_become_structured_output_and_reasoning(client, engine):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    client.chat(model=MODEL, messages=USER, format=schema, think=False, stream=False)
    request = engine.submitted[-1]
    assert request.response_format.schema == schema and request.thinking is False
    client.generate(model=MODEL, prompt="hi", format="json", think="high", stream=False)
    request = engine.submitted[-1]
    assert request.response_format.schema == {"type": "object"} and request.thinking is True


def test_generate(client, engine):
    engine.script(text_events("Par", "is", prompt_tokens=5))
    answer = client.generate(model=MODEL, prompt="Capital of France?", system="One word.", stream=False)
    assert answer.response == "Paris" and answer.done and answer.done_reason == "stop"
    assert engine.submitted[-1].messages == (Message("system", "One word."), Message("user", "Capital of France?"))
    engine.script([TextDelta("a"), Finished(FinishReason.LENGTH, Usage(3, 1))])
    chunks = list(client.generate(model=f"{MODEL}:latest", prompt="go", stream=True))
    assert [c.response for c in chunks] == ["a", ""] and chunks[-1].done_reason == "length"
    assert chunks[-1].model == f"{MODEL}:latest" and engine.submitted[-1].model == MODEL


def test_an_empty_prompt_only_loads(client, engine):
    answer = client.generate(model=MODEL)
    assert answer.done and answer.done_reason == "load" and answer.response == ""
    chat = client.chat(model=MODEL, messages=[], stream=False)
    assert chat.done_reason == "load"
    assert engine.submitted == []


@pytest.mark.parametrize("body, fragment", [
    ({"prompt": "x", "raw": True}, "raw"),
    ({"prompt": "x", "suffix": "return y"}, "suffix"),
    ({"prompt": "x", "images": ["aGk="]}, "image"),
    ({"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ({"prompt": "x", "options": {"num_predict": 0}}, "num_predict"),
])
def test_generate_refuses_what_it_cannot_honour(client, body, fragment):
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model=MODEL, stream=False, **body)
    assert caught.value.status_code == 400 and fragment in caught.value.error


@pytest.mark.parametrize("body, fragment", [
    # the client validates these itself; other clients send them
    ({"format": "yaml"}, "format"),
    ({"think": "hard"}, "think"),
    ({"options": {"temperature": "hot"}}, "temperature"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
     "arguments"),
])
def test_bad_chat_fields_are_400_naming_the_field(server, body, fragment):
    status, answer = raw(server, "POST", "/api/chat", json.dumps({"model": MODEL, "messages": USER, **body}).encode())
    assert status == 400 and set(answer) == {"error"} and fragment in answer["error"]


def test_errors_are_ollama_shaped(server, client, engine):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="nope", messages=USER)
    assert caught.value.status_code == 404 and "nope" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert caught.value.status_code == 400 and "image" in caught.value.error
    engine.fail_next(Overloaded("queue full"))
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=USER, stream=False)
    assert caught.value.status_code == 503
    status, body = raw(server, "POST", "/api/chat", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]
    status, body = raw(server, "POST", "/api/chat", b'{"model": 3}')
    assert status == 400 and set(body) == {"error"} and "model" in body["error"]
    status, body = raw(server, "POST", "/api/create", b"{}")
    assert status == 404 and set(body) == {"error"}
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model=MODEL, input="hi")
    assert caught.value.status_code == 400 and "embeddings" in caught.value.error


def test_an_engine_failure_mid_stream_is_an_error_line(client, engine):
    engine.script(error_events("par", message="CUDA out of memory"))
    chunks = client.chat(model=MODEL, messages=USER, stream=True)
    assert next(chunks).message.content == "par"
    with pytest.raises(ollama.ResponseError, match="CUDA out of memory"):
        next(chunks)


def test_probe_version_tags_show_ps(server, client):
    assert raw(server, "GET", "/") == (200, "Ollama is running")
    assert raw(server, "HEAD", "/")[0] == 200
    assert raw(server, "GET", "/api/version") == (200, {"version": wire.API_VERSION})
    assert [m.model for m in client.list().models] == [MODEL]
    running = client.ps().models
    assert [(m.model, m.context_length) for m in running] == [(MODEL, FAKE_MODEL.context_length)]
    shown = client.show(f"{MODEL}:latest")
    assert "tools" in shown.capabilities and shown.modelinfo["unknown.context_length"] == FAKE_MODEL.context_length
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("nope")
    assert caught.value.status_code == 404


def test_pull_of_the_served_model_succeeds_at_once(client):
    statuses = [p.status for p in client.pull(MODEL, stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert client.pull(MODEL).status == "success"


def test_pull_without_a_store_is_refused(client):
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("someone/some-model")
    assert caught.value.status_code == 400 and "store" in caught.value.error


def test_with_an_api_key_only_the_probe_is_open(serve, engine):
    keyed = serve(engine, api_key="secret-key")
    assert raw(keyed, "GET", "/") == (200, "Ollama is running")
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=keyed.url, timeout=10).list()
    assert caught.value.status_code == 401 and "API key" in caught.value.error
    keyed_client = ollama.Client(host=keyed.url, headers={"Authorization": "Bearer secret-key"}, timeout=10)
    assert [m.model for m in keyed_client.list().models] == [MODEL]


def test_a_client_that_hangs_up_mid_stream_aborts_the_request(client, engine):
    engine.script(text_events(*["tok"] * 50), delay=0.05)
    chunks = client.chat(model=MODEL, messages=USER, stream=True)
    assert next(chunks).message.content == "tok"
    chunks.close()  # leaves the client's response context: the connection closes
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.aborted == [engine.submitted[-1].id]
