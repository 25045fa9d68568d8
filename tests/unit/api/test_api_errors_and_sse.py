"""The exception → HTTP mapper, SSE framing, and the server helper the daemon uses."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from aiohttp import web

from tests.support.fake_engine import FakeEngineClient, error_events
from zllm.api import create_app, run_server
from zllm.api.errors import (
    ApiError,
    ReportedError,
    describe_code,
    describe_exception,
    openai_error_body,
)
from zllm.api.sse import SseMessage, encode_frame
from zllm.errors import (
    ContextLengthExceeded,
    EngineFailure,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
)


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [
        (InvalidRequest("bad", param="x"),
         400, {"message": "bad", "type": "invalid_request_error", "param": "x", "code": None}),
        (ModelNotFound("m"), 404, {"message": "The model `m` does not exist.", "type": "invalid_request_error",
                                   "param": "model", "code": "model_not_found"}),
        (ContextLengthExceeded(10, 5), 400, {"message": "prompt is too long: 10 tokens > 5 maximum",
                                             "type": "invalid_request_error", "param": "messages",
                                             "code": "context_length_exceeded"}),
        (Overloaded("busy"), 503, {"message": "busy", "type": "server_error", "param": None, "code": "overloaded"}),
        (EngineFailure("oom"), 500, {"message": "oom", "type": "server_error", "param": None,
                                     "code": "engine_error"}),
        (ReportedError("overloaded", "shutting down"), 503,
         {"message": "shutting down", "type": "server_error", "param": None, "code": "overloaded"}),
    ],
)
def test_openai_error_mapping(exc, status, error):
    api_error = describe_exception(exc)
    assert api_error.status == status
    assert openai_error_body(api_error) == {"error": error}


def test_unknown_exception_hides_its_message():
    api_error = describe_exception(KeyError("internal"))
    assert (api_error.status, api_error.code) == (500, "internal_error")
    assert "internal'" not in api_error.message


def test_unknown_code_is_a_server_error():
    assert describe_code("pull_failed", "x") == ApiError(500, "server_error", "pull_failed", "x")


def test_http_exceptions_keep_their_status():
    assert describe_exception(web.HTTPNotFound()).status == 404
    assert describe_exception(web.HTTPMethodNotAllowed("POST", ["GET"])).kind == "invalid_request"


@pytest.mark.parametrize(
    ("payload", "wire"),
    [
        ({"a": 1}, b'data: {"a":1}\n\n'),
        ("[DONE]", b"data: [DONE]\n\n"),
        (SseMessage({"type": "ping"}, event="ping"), b'event: ping\ndata: {"type":"ping"}\n\n'),
        (SseMessage("two\nlines"), b"data: two\ndata: lines\n\n"),
        ({"t": "é\n"}, 'data: {"t":"\\u00e9\\n"}\n\n'.encode()),
    ],
)
def test_sse_frames(payload, wire):
    assert encode_frame(payload) == wire


def test_error_finish_mid_stream_sends_an_error_frame_and_ends(serve):
    engine = FakeEngineClient().script(error_events("partial", code="engine_error", message="device lost"))
    server = serve(engine)
    body = json.dumps({"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        frames = [f for f in response.read().decode().split("\n\n") if f]
    assert json.loads(frames[-1].removeprefix("data: ")) == {
        "error": {"message": "device lost", "type": "server_error", "param": None, "code": "engine_error"}}
    assert '"content":"partial"' in frames[-2]
    assert "[DONE]" not in "".join(frames)
    assert engine.aborted == []


def test_run_server_serves_until_cancelled():
    async def scenario():
        import socket

        with socket.socket() as probe:  # a free port for run_server, which takes a fixed one like the daemon
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ready = asyncio.Event()
        task = asyncio.create_task(run_server(create_app(FakeEngineClient()), "127.0.0.1", port, ready=ready))
        await asyncio.wait_for(ready.wait(), 10)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return answer

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"status": "ok"' in answer
