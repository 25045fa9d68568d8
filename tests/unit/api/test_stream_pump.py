"""The one stream pump (api/stream_pump.py) behind every streaming edge: a failure of the encoder mid-stream is
reported in the API's own error shape as the stream's last frame, and the engine request is aborted, on SSE
(three APIs), Ollama's NDJSON and the Responses WebSocket alike."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx
import pytest

from tests.support.fake_engine import text_events

# an event no encoder knows: its `feed` raises, as a bug in an encoder would
BROKEN_STREAM = [*text_events("Hello")[:1], "not a canonical event"]
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
AUTH = {"Authorization": "Bearer test-key", "x-api-key": "test-key", "anthropic-version": "2023-06-01"}


def sse_frames(body: str) -> list[tuple[str | None, str]]:
    frames = []
    for block in body.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        event = next((line[len("event: "):] for line in lines if line.startswith("event: ")), None)
        data = "".join(line[len("data: "):] for line in lines if line.startswith("data: "))
        frames.append((event, data))
    return frames


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=10)


@pytest.mark.parametrize(("path", "body", "last_frame"), [
    ("/v1/chat/completions", CHAT, lambda event, data: json.loads(data)["error"]["code"] == "internal_error"),
    ("/v1/messages", {**CHAT, "max_tokens": 10},
     lambda event, data: event == "error" and json.loads(data)["error"]["type"] == "api_error"),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "stream": True},
     lambda event, data: event == "response.failed" and json.loads(data)["response"]["status"] == "failed"),
])
def test_a_failing_encoder_ends_an_sse_stream_with_an_error_frame(server, engine, path, body, last_frame):
    engine.script(BROKEN_STREAM)
    response = post(server, path, body)
    assert response.status_code == 200
    frames = sse_frames(response.text)
    assert len(frames) >= 2  # the start and the first text went out before the failure
    assert last_frame(*frames[-1]), frames[-1]
    assert engine.aborted == [engine.submitted[0].id]


def test_a_failing_encoder_ends_an_ndjson_stream_with_an_error_line(server, engine):
    engine.script(BROKEN_STREAM)
    response = post(server, "/api/chat", CHAT)
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[0]["message"]["content"] == "Hello"
    assert set(lines[-1]) == {"error"}
    assert engine.aborted == [engine.submitted[0].id]


def test_a_failing_encoder_ends_a_websocket_response_and_keeps_the_socket(server, engine):
    engine.script(BROKEN_STREAM)
    engine.script(text_events("Fine."))
    create = {"type": "response.create", "model": "fake-model", "store": False, "input": "hi"}

    async def receive_response(ws) -> list[dict]:
        frames = [await asyncio.wait_for(ws.receive_json(), 10)]
        while frames[-1]["type"] not in ("response.completed", "response.failed"):
            frames.append(await asyncio.wait_for(ws.receive_json(), 10))
        return frames

    async def main():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{server.url}/v1/responses", headers=AUTH) as ws:
                await ws.send_json(create)
                failed = await receive_response(ws)
                await ws.send_json(create)
                return failed, await receive_response(ws)

    failed, next_one = asyncio.run(main())
    assert failed[0]["type"] == "response.created" and failed[-1]["type"] == "response.failed"
    assert next_one[-1]["type"] == "response.completed"
    assert engine.aborted == [engine.submitted[0].id]
