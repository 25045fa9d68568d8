"""The contract a client relies on, the same on every engine (conftest.py's `served`: the local engine, and vLLM
when a vLLM Python is configured): the three APIs' streaming shapes, tool calls under fences, a second turn's
cached tokens, Responses chains across a zllm restart, cancellation and bad input. One daemon per engine for the
module (the restart test's daemons share its engine: on vLLM they attach to its server)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

import anthropic
import openai
import pytest
import requests

from tests.integration.conftest import Served
from tests.support.daemon import Daemon

pytestmark = pytest.mark.timeout(900)

# > 2 of vLLM's 32-token blocks, well inside either window with room for a second turn
SYSTEM = "You answer briefly and you never use lists or headings in any answer. " * 4
# an enum keeps a random-weight model's argument short (a free string may run on to max_tokens)
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": CITY}}
DECLARED = {"get_weather", "get_time"}


def test_chat_stream_shape(served: Served) -> None:
    chunks = list(served.openai().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0  # usage comes last, once
    assert sum(1 for c in chunks if c.usage is not None) == 1


def test_responses_stream_shape(served: Served) -> None:
    events = list(served.openai().responses.create(model=served.model, input="Say hello.", max_output_tokens=6,
                                                   temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text


def test_messages_stream_shape(served: Served) -> None:
    claude = anthropic.Anthropic(base_url=served.daemon.base_url, api_key="test-key", max_retries=0, timeout=120)
    with claude.messages.stream(model=served.model, max_tokens=6, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].text and final.usage.output_tokens > 0


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_tool_call_is_valid(served: Served, choice) -> None:
    answer = served.openai().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
        tool_choice=choice, max_tokens=96, temperature=0)
    calls, finish = answer.choices[0].message.tool_calls, answer.choices[0].finish_reason
    # the fence allows more calls: a random-weight model goes on until max_tokens or the loop guard stops it
    assert calls and finish in ("tool_calls", "length", "repetition")
    complete = calls[:-1] if finish == "length" else calls
    assert complete
    for call in complete:
        assert call.function.name in DECLARED
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Lyon")
    if isinstance(choice, dict):
        assert {call.function.name for call in calls} == {"get_time"}


def test_auto_stays_free_text_until_the_opener(served: Served) -> None:
    answer = served.openai().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Write one word about the sea."}],
        tools=[WEATHER], tool_choice="auto", max_tokens=8, temperature=0)
    message = answer.choices[0].message
    assert message.content or message.tool_calls  # text is allowed; a call, once opened, is valid
    for call in message.tool_calls or ():
        assert call.function.name in DECLARED and json.loads(call.function.arguments)


def test_the_second_turn_reports_cached_tokens(served: Served) -> None:
    client = served.openai()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    first = client.chat.completions.create(model=served.model, messages=messages, max_tokens=4, temperature=0)
    turn2 = [*messages, {"role": "assistant", "content": first.choices[0].message.content or "Hello."},
             {"role": "user", "content": "Bye."}]
    second = client.chat.completions.create(model=served.model, messages=turn2, max_tokens=4, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_a_responses_chain_continues_across_a_zllm_restart(served: Served, tmp_path: Path) -> None:
    """Turn 1 on one daemon; a new daemon over the same state (on vLLM: the same server, which kept its KV)
    continues it with `previous_response_id`, over HTTP and then over the WebSocket, from the prefix cache."""
    # one install: the state dir (responses, the namespace secret) and the cache dir (the local engines' SSD tier)
    env = {"ZLLM_CACHE_DIR": str(tmp_path / "cache"), "ZLLM_SSD_MIN_TOKENS": "1"}
    opening = [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "Say hello."}]
    before = served.sibling(tmp_path / "before", env)
    try:
        first = responses(before).create(model=served.model, input=opening, max_output_tokens=6, temperature=0)
    finally:
        before.stop()  # SIGTERM: the local engine's snapshot writes finish first
    after = served.sibling(tmp_path / "after", env)
    try:
        client = responses(after)
        assert client.retrieve(first.id).output_text == first.output_text
        second = client.create(model=served.model, input="And goodbye?", previous_response_id=first.id,
                               max_output_tokens=6, temperature=0)
        assert second.previous_response_id == first.id
        # the stored turn is in the prompt (input and output), and its prefix came from the cache
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens // 2
        assert second.usage.input_tokens_details.cached_tokens > 0
        third = asyncio.run(websocket_turn(after, {"type": "response.create", "model": served.model,
                                                   "previous_response_id": second.id, "input": "Once more.",
                                                   "max_output_tokens": 6, "temperature": 0}))
        assert third["type"] in ("response.completed", "response.incomplete"), third
        assert third["response"]["previous_response_id"] == second.id
        assert third["response"]["usage"]["input_tokens"] > second.usage.input_tokens
        assert third["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0
    finally:
        after.stop()


def responses(daemon: Daemon):
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=120).responses


async def websocket_turn(daemon: Daemon, frame: dict) -> dict:
    """One `response.create` over the Responses WebSocket; its last frame."""
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer test-key"}) as session:
        async with session.ws_connect(f"{daemon.base_url}/v1/responses") as ws:
            await ws.send_json(frame)
            while True:
                last = await asyncio.wait_for(ws.receive_json(), 120)
                if last["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    return last


def test_a_cancelled_stream_frees_its_request(served: Served) -> None:
    stream = served.openai().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Count from 1 to 500."}],
        max_tokens=served.context - 64, temperature=0, stream=True)  # far longer than the deadline below
    chunks = iter(stream)
    next(chunks)
    next(chunks)
    stream.close()
    control = served.daemon.control()
    deadline = time.monotonic() + 5  # gone with the client, not when max_tokens ran out
    while control.call("status")["requests_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert control.call("status")["requests_running"] == 0
    again = served.openai().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=2)
    assert again.usage.completion_tokens > 0


def test_bad_input_gets_a_4xx_in_each_apis_shape(served: Served) -> None:
    base, model = served.daemon.base_url, served.model
    too_long = "word " * (served.context * 2)
    cases = [
        ("/v1/chat/completions", {"model": model, "messages": "not a list"}, "openai"),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": too_long}]}, "openai"),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}],
                                  "tools": [WEATHER], "tool_choice": {"type": "function",
                                                                      "function": {"name": "undeclared"}}}, "openai"),
        ("/v1/responses", {"model": "no-such-model", "input": "Hi."}, "openai"),
        ("/v1/messages", {"model": model, "messages": [{"role": "user", "content": "Hi."}]}, "anthropic"),
        ("/v1/messages", {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": too_long}]},
         "anthropic"),
    ]
    for path, body, shape in cases:
        answer = requests.post(base + path, json=body, timeout=60)
        assert 400 <= answer.status_code < 500, (path, body if len(str(body)) < 300 else "...", answer.text[:300])
        error = answer.json()
        if shape == "anthropic":
            assert error["type"] == "error" and error["error"]["message"]
        else:
            assert error["error"]["message"] and error["error"]["type"]
    assert served.daemon.control().call("status")["phase"] == "ready"
