"""`POST /v1/responses/{id}/cancel` on responses being generated, driven by the official openai SDK over a real
port: the fake engine for every mode (SSE, plain, WebSocket), then the tiny Qwen model through LocalEngineClient."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import openai
import pytest

from tests.support.fake_engine import text_events
from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import tiny_qwen_dir
from zllm.api import create_app
from zllm.api.openai_responses.context import IN_FLIGHT

WORD_DELAY_S = 0.02
# 10 s of words unless cancelled: a response that ends within PROMPT_S was cut short by the cancel (5 s: a
# loaded 2-core CI machine took over 2 s to carry the cancel over two SDK clients)
ENDLESS = text_events(*["word "] * 500)
PROMPT_S = 5.0
TERMINAL_TYPES = ("response.completed", "response.incomplete", "response.failed")


def running(server) -> list[str]:
    # the registry's contents are not on the wire; read them to show entries leave with their response
    return list(server.app[IN_FLIGHT]._by_id)


def read_until_text(events) -> list:
    head = []
    for event in events:
        head.append(event)
        if event.type == "response.output_text.delta":
            return head
    raise AssertionError(f"the stream ended before any text: {[e.type for e in head]}")


def cancel_mid_stream(streamer: openai.OpenAI, canceller: openai.OpenAI, **fields):
    """Start a streaming response, read up to its first text, cancel it from another client; (events, the
    cancel's answer, seconds from the cancel to the stream's end)."""
    with streamer.responses.create(model="fake-model", input="hi", stream=True, **fields) as stream:
        events = iter(stream)
        head = read_until_text(events)
        started = time.monotonic()
        cancelled = canceller.responses.cancel(head[0].response.id)
        tail = list(events)
    return head + tail, cancelled, time.monotonic() - started


def test_cancel_ends_a_streaming_response_as_cancelled(server, engine, make_client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    client = make_client(server)
    events, cancelled, took = cancel_mid_stream(make_client(server), client)
    terminal = events[-1]
    assert took < PROMPT_S
    assert [e.type for e in events if e.type in TERMINAL_TYPES] == ["response.incomplete"]
    assert (terminal.response.status, terminal.response.incomplete_details) == ("cancelled", None)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (cancelled.id, cancelled.status) == (events[0].response.id, "cancelled")
    assert cancelled.output_text == terminal.response.output_text and cancelled.output_text.startswith("word ")
    assert cancelled.output[0].status == "incomplete" and cancelled.usage is not None
    assert engine.aborted == [engine.submitted[-1].id]
    assert client.responses.retrieve(cancelled.id).status == "cancelled"
    assert client.responses.cancel(cancelled.id).status == "cancelled"  # cancelling twice is idempotent
    assert running(server) == []


def test_a_cancelled_store_false_response_is_gone_once_it_ended(server, engine, make_client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    client = make_client(server)
    _, cancelled, _ = cancel_mid_stream(make_client(server), client, store=False)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel(cancelled.id)


def test_cancelling_a_finished_response_is_400_in_openai_shape(client, engine):
    response = client.responses.create(model="fake-model", input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.cancel(response.id)
    assert caught.value.body == {"message": "Cannot cancel a completed response.", "type": "invalid_request_error",
                                 "param": None, "code": None}
    assert client.responses.retrieve(response.id).status == "completed" and engine.aborted == []


def test_cancelling_an_unknown_response_is_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.cancel("resp_unknown")
    assert caught.value.body == {"message": "No response found with id 'resp_unknown'.",
                                 "type": "invalid_request_error", "param": "response_id",
                                 "code": "response_not_found"}


def test_another_api_key_cannot_cancel_a_response(server, engine, make_client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    alice, bob = make_client(server, "key-alice"), make_client(server, "key-bob")
    with alice.responses.create(model="fake-model", input="hi", stream=True) as stream:
        events = iter(stream)
        response_id = read_until_text(events)[0].response.id
        with pytest.raises(openai.NotFoundError):
            bob.responses.cancel(response_id)
        assert engine.aborted == [] and running(server) == [response_id]
        assert alice.responses.cancel(response_id).status == "cancelled"
        assert list(events)[-1].response.status == "cancelled"


def test_a_disconnect_aborts_without_recording_a_cancel(server, engine, client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    with client.responses.create(model="fake-model", input="hi", stream=True) as stream:
        response_id = read_until_text(iter(stream))[0].response.id
    deadline = time.monotonic() + PROMPT_S
    while (running(server) or not engine.aborted) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running(server) == [] and engine.aborted == [engine.submitted[-1].id]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel(response_id)


def test_cancel_answers_a_waiting_non_streaming_create(server, engine, client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(client.responses.create(model="fake-model",
                                                                                       input="hi")))
    waiting.start()
    deadline = time.monotonic() + PROMPT_S
    while not running(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    (response_id,) = running(server)
    time.sleep(5 * WORD_DELAY_S)  # some words in
    cancelled = client.responses.cancel(response_id)
    waiting.join(PROMPT_S)
    (answer,) = answers
    assert (answer.id, answer.status, cancelled.status) == (response_id, "cancelled", "cancelled")
    assert answer.output_text == cancelled.output_text != ""


def test_cancel_ends_a_websocket_response_and_the_socket_stays_usable(server, engine, client):
    engine.script(ENDLESS, delay=WORD_DELAY_S)
    create = {"type": "response.create", "model": "fake-model", "input": "hi", "store": False}

    async def conversation(ws):
        await ws.send_json(create)
        created = await ws.receive_json(timeout=10)
        while (await ws.receive_json(timeout=10))["type"] != "response.output_text.delta":
            pass
        cancelled = await asyncio.to_thread(client.responses.cancel, created["response"]["id"])
        frames = [await ws.receive_json(timeout=10)]
        while frames[-1]["type"] not in TERMINAL_TYPES:
            frames.append(await ws.receive_json(timeout=10))
        await ws.send_json(create)
        following = [await ws.receive_json(timeout=10)]
        while following[-1]["type"] not in TERMINAL_TYPES:
            following.append(await ws.receive_json(timeout=10))
        return cancelled, frames[-1], following[-1]

    async def main():
        headers = {"Authorization": "Bearer test-key"}
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{server.url}/v1/responses",
                                                                           headers=headers) as ws:
            return await conversation(ws)

    cancelled, terminal, following = asyncio.run(main())
    assert (terminal["type"], terminal["response"]["status"]) == ("response.incomplete", "cancelled")
    assert cancelled.status == "cancelled" and cancelled.output_text.startswith("word ")
    assert following["type"] == "response.completed" and engine.aborted == [engine.submitted[0].id]


# ------------------------------------------------------------------------------------------ a real engine


@pytest.fixture
def tiny_served():
    from zllm.engine.torch.loader import load_model
    from zllm.runtime.client import LocalEngineClient

    reports = []
    loaded = load_model(tiny_qwen_dir(), device="cpu", dtype="float32", threads=1)
    engine = LocalEngineClient(loaded, "tiny", 0, observer=reports.append)
    with ThreadedServer(create_app(engine)) as server:
        yield server, reports
    engine.close()


def test_cancel_aborts_the_engine_request_of_a_real_model(tiny_served, make_client):
    server, reports = tiny_served
    streamer, canceller = make_client(server), make_client(server)
    max_tokens = 400  # far more than a cancel right after the first word lets it make
    with streamer.responses.create(model="tiny", input="Tell a long story.", stream=True, temperature=0,
                                   max_output_tokens=max_tokens) as stream:
        events = iter(stream)
        response_id = read_until_text(events)[0].response.id
        cancelled = canceller.responses.cancel(response_id)
        terminal = list(events)[-1]
    assert (terminal.type, terminal.response.status, cancelled.status) == ("response.incomplete", "cancelled",
                                                                          "cancelled")
    # the engine reports a request finished after its last event went to the client: give the report a moment
    deadline = time.monotonic() + 10
    while not any(report.phase == "finished" for report in reports) and time.monotonic() < deadline:
        time.sleep(0.05)
    (finished,) = [report for report in reports if report.phase == "finished"]
    assert finished.finish_reason == "abort" and 0 < finished.completion_tokens < max_tokens
    assert cancelled.usage.output_tokens == finished.completion_tokens
