"""`/v1/responses` over HTTP on a real port, driven by the official openai SDK against the fake engine."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.fake_engine import error_events, text_events, tool_call_events
from zllm.api.auth import NAMESPACE_SECRET, namespace_for_key
from zllm.canonical import Finished, FinishReason, Message, ReasoningDelta, ToolCall, Usage
from zllm.errors import ContextLengthExceeded

SH = {"type": "function", "name": "sh", "description": "run a command",
      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


def test_non_streaming_text(client, engine, server):
    engine.script(text_events("Hello", " world", prompt_tokens=12, cached_tokens=8))
    response = client.responses.create(model="fake-model", input="hi", instructions="Be brief.", temperature=0,
                                       metadata={"k": "v"}, max_output_tokens=50)
    assert (response.object, response.status, response.output_text) == ("response", "completed", "Hello world")
    assert response.id.startswith("resp_") and response.output[0].id.startswith("msg_")
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 2, 14)
    assert response.usage.input_tokens_details.cached_tokens == 8
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert (response.instructions, response.metadata, response.max_output_tokens) == ("Be brief.", {"k": "v"}, 50)
    request = engine.submitted[-1]
    assert request.messages == (Message("system", "Be brief."), Message("user", "hi"))
    assert (request.sampling.temperature, request.sampling.max_tokens) == (0.0, 50)
    namespace = namespace_for_key("test-key", server.app[NAMESPACE_SECRET])
    assert request.namespace == namespace and request.api == "openai_responses"


def test_streaming_events(client, engine):
    engine.script(text_events("Hel", "lo"))
    events = list(client.responses.create(model="fake-model", input="hi", stream=True))
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "Hello"


def test_stream_helper_accumulates_reasoning_and_a_function_call(client, engine):
    arguments = json.dumps({"cmd": "ls -la"})
    engine.script([ReasoningDelta("I should "), ReasoningDelta("list."),
                   *tool_call_events("sh", arguments, chunk=3, call_id="engine-id")])
    with client.responses.stream(model="fake-model", input="list files", tools=[SH]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    reasoning, call = final.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "I should list."
    assert (call.type, call.name, call.arguments, call.status) == ("function_call", "sh", arguments, "completed")
    assert call.call_id.startswith("call_") and call.call_id != "engine-id" and call.id.startswith("fc_")
    assert engine.submitted[-1].tools[0].name == "sh"


def test_previous_response_id_chains_the_conversation(client, engine):
    engine.script(tool_call_events("sh", '{"cmd":"ls"}', text="Looking."))
    first = client.responses.create(model="fake-model", input="what is here?", tools=[SH],
                                    instructions="Be brief.")
    call = first.output[1]
    second = client.responses.create(model="fake-model", previous_response_id=first.id, tools=[SH],
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "a.txt"}])
    assert second.previous_response_id == first.id
    assert engine.submitted[-1].messages == (
        Message("user", "what is here?"),   # instructions do not carry over
        Message("assistant", "Looking.", tool_calls=(ToolCall(call.call_id, "sh", '{"cmd":"ls"}'),)),
        Message("tool", "a.txt", tool_call_id=call.call_id, name="sh"),
    )
    third = client.responses.create(model="fake-model", previous_response_id=second.id, input="and now?")
    assert engine.submitted[-1].messages[3:] == (Message("assistant", "Hello world"), Message("user", "and now?"))
    assert third.status == "completed"


def test_retrieve_and_delete(client, engine):
    response = client.responses.create(model="fake-model", input="hi")
    fetched = client.responses.retrieve(response.id)
    assert (fetched.id, fetched.status, fetched.output_text) == (response.id, "completed", "Hello world")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(response.id)
    assert caught.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)


def test_store_false_is_neither_retrievable_nor_chainable_over_http(client, engine):
    response = client.responses.create(model="fake-model", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="fake-model", input="x", previous_response_id=response.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert caught.value.body["param"] == "previous_response_id"


def test_namespaces_are_isolated(server, engine, make_client):
    alice, bob = make_client(server, "key-alice"), make_client(server, "key-bob")
    response = alice.responses.create(model="fake-model", input="secret")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="fake-model", input="x", previous_response_id=response.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(response.id)
    assert alice.responses.retrieve(response.id).id == response.id


def test_context_length_exceeded_is_400_before_streaming(client, engine):
    engine.fail_next(ContextLengthExceeded(9000, 8192))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input="long", stream=True)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "9000 tokens > 8192" in caught.value.body["message"]


def test_failure_after_the_stream_started_is_response_failed(client, engine):
    engine.script(error_events("par", code="context_length_exceeded", message="prompt is too long"))
    events = list(client.responses.create(model="fake-model", input="hi", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "context_length_exceeded"


def test_non_streaming_engine_failure_is_an_http_error(client, engine):
    engine.script(error_events(code="engine_error", message="CUDA out of memory"))
    with pytest.raises(openai.InternalServerError) as caught:
        client.responses.create(model="fake-model", input="hi")
    assert "CUDA out of memory" in caught.value.body["message"]


def test_max_output_tokens_is_incomplete(client, engine):
    from zllm.canonical import FinishReason

    engine.script(text_events("a", reason=FinishReason.LENGTH))
    response = client.responses.create(model="fake-model", input="hi", max_output_tokens=1)
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")


@pytest.mark.parametrize(("kwargs", "error", "code"), [
    ({"model": "nope", "input": "x"}, openai.NotFoundError, "model_not_found"),
    ({"model": "fake-model", "input": "x", "previous_response_id": "resp_unknown"}, openai.NotFoundError,
     "previous_response_not_found"),
    ({"model": "fake-model", "input": "x", "text": {"format": {"type": "xml"}}}, openai.BadRequestError, None),
])
def test_errors_in_openai_shape(client, kwargs, error, code):
    with pytest.raises(error) as caught:
        client.responses.create(**kwargs)
    assert caught.value.body["code"] == code
    assert set(caught.value.body) == {"message", "type", "param", "code"}


def test_prewarm_over_http(client, engine):
    response = client.responses.create(model="fake-model", input=[], extra_body={"generate": False})
    assert (response.status, response.output) == ("completed", [])
    assert engine.submitted == []
    follow_up = client.responses.create(model="fake-model", input="hi", previous_response_id=response.id)
    assert follow_up.status == "completed"
    streamed = list(client.responses.create(model="fake-model", input=[], stream=True,
                                            extra_body={"generate": False}))
    assert [(e.type, e.sequence_number) for e in streamed] == [("response.created", 0), ("response.completed", 1)]
    assert len(engine.submitted) == 1


def test_a_stored_prewarm_is_held_to_the_context_window(client, engine):
    """generate:false with store:true keeps the input: a prompt no turn could use is refused, not stored."""
    too_long = " ".join(["word"] * 9000)  # the fake engine counts words: over its 8192-token window
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input=too_long, store=True, extra_body={"generate": False})
    assert caught.value.body["code"] == "context_length_exceeded"
    fits = client.responses.create(model="fake-model", input="short", store=True, extra_body={"generate": False})
    assert fits.status == "completed" and engine.submitted == []


def test_a_persistent_store_keeps_chains_across_a_restart(serve, engine, tmp_path, make_client):
    from tests.support.http_server import ThreadedServer
    from zllm.api import create_app
    from zllm.store import ResponseStore

    store, secret = ResponseStore(tmp_path / "responses.sqlite3"), b"per-install namespace secret"
    with ThreadedServer(create_app(engine, responses=store, namespace_secret=secret)) as first_server:
        first = make_client(first_server).responses.create(model="fake-model", input="remember me")
    store.close()
    reopened = ResponseStore(tmp_path / "responses.sqlite3")
    second_server = serve(engine, responses=reopened, namespace_secret=secret)  # the daemon keeps it in state_dir
    make_client(second_server).responses.create(model="fake-model", input="next", previous_response_id=first.id)
    assert engine.submitted[-1].messages == (Message("user", "remember me"), Message("assistant", "Hello world"),
                                             Message("user", "next"))


def test_codex_hanging_up_right_after_completed_is_a_normal_end(server, engine, client, caplog):
    # Codex closes the connection after `response.completed`, before the chunked terminator
    import logging
    import socket

    caplog.set_level(logging.INFO)
    body = json.dumps({"model": "fake-model", "input": "hi", "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Authorization: Bearer test-key\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while b"event: response.completed" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    sock.close()
    response_id = json.loads(received.split(b"data: ", 2)[1].split(b"\n")[0])["response"]["id"]
    assert client.responses.retrieve(response_id).status == "completed"  # recorded despite the hang-up
    assert engine.aborted == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_plain_get_without_upgrade_is_405_in_openai_shape(server):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{server.url}/v1/responses", timeout=10)
    assert caught.value.code == 405
    error = json.load(caught.value)["error"]
    assert error["type"] == "invalid_request_error" and "Upgrade: websocket" in error["message"]


def test_prewarm_overrides_generate_false_and_cannot_compact(client, engine):
    engine.script([Finished(FinishReason.PREFILLED, Usage(12, 0, 2, cache_write_tokens=10))])
    response = client.responses.create(model="fake-model", input="hi", prompt_cache_options={"prewarm": True},
                                       extra_body={"generate": False})
    assert (response.status, response.output, response.usage.output_tokens) == ("completed", [], 0)
    details = response.usage.input_tokens_details
    assert (details.cached_tokens, details.cache_write_tokens) == (2, 10)
    assert engine.submitted[-1].prefill_only, "a prewarm runs, unlike a bare `generate: false`"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input=[{"role": "user", "content": "hi"},
                                                           {"type": "compaction_trigger"}],
                                prompt_cache_options={"prewarm": True})
    assert caught.value.body["param"] == "prompt_cache_options"
