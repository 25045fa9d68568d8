"""OpenAI Responses end to end: the openai SDK (and aiohttp's WebSocket client) against a real daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.integration.conftest import CONTEXT, TINY, linked_data_dir
from tests.support.daemon import Daemon

MAX_OUT = 8


def start_daemon(data_dir: Path, state_dir: Path, *args: str) -> Daemon:
    """A daemon with its own data dir over the shared models (the module's daemon may still be running)."""
    env = {"ZLLM_STATE_DIR": str(state_dir)}
    return Daemon(linked_data_dir(data_dir, state_dir), TINY, "--context-length", str(CONTEXT), *args,
                  env=env).wait_ready()


def sdk(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def responses_daemon(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    daemon = start_daemon(tiny_data_dir, tmp_path_factory.mktemp("zllm-state"))
    yield daemon
    daemon.stop()


@pytest.fixture()
def client(responses_daemon: Daemon) -> openai.OpenAI:
    return sdk(responses_daemon)


def greedy(client: openai.OpenAI, **kwargs):
    return client.responses.create(**{"model": TINY, "input": "Say hello.", "temperature": 0,
                                      "max_output_tokens": MAX_OUT, **kwargs})


def test_non_streaming_stops_at_max_output_tokens(client: openai.OpenAI) -> None:
    response = greedy(client)
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert response.output[0].type == "message" and response.output_text
    assert response.usage.output_tokens == MAX_OUT and response.usage.input_tokens > 5
    assert response.usage.total_tokens == response.usage.input_tokens + MAX_OUT


def test_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    whole = greedy(client).output_text
    events = list(greedy(client, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_prompt_longer_than_the_window_is_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        greedy(client, input="hello " * (CONTEXT * 2), stream=True)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert f"> {CONTEXT} maximum" in caught.value.body["message"]


def test_a_chain_continues_across_a_daemon_restart(tiny_data_dir: Path, tmp_path: Path) -> None:
    first_daemon = start_daemon(tiny_data_dir, tmp_path)
    try:
        first = greedy(sdk(first_daemon))
    finally:
        first_daemon.stop()
    assert (tmp_path / "responses.sqlite3").exists()
    second_daemon = start_daemon(tiny_data_dir, tmp_path)
    try:
        client = sdk(second_daemon)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        second = greedy(client, input="And again.", previous_response_id=first.id)
        # the stored turn (input + output) is in the prompt: more than the new input alone
        alone = greedy(client, input="And again.")
        assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens // 2
        assert second.previous_response_id == first.id
        with pytest.raises(openai.NotFoundError):
            greedy(client, previous_response_id="resp_unknown")
    finally:
        second_daemon.stop()


def test_a_websocket_turn(responses_daemon: Daemon) -> None:
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
    base = {"type": "response.create", "model": TINY, "store": False, "temperature": 0,
            "max_output_tokens": MAX_OUT}

    async def receive_until_done(ws) -> list[dict]:
        frames = [await asyncio.wait_for(ws.receive_json(), 60)]
        while frames[-1]["type"] not in ("response.completed", "response.incomplete", "response.failed", "error"):
            frames.append(await asyncio.wait_for(ws.receive_json(), 60))
        return frames

    async def main():
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer test-key"}) as session:
            async with session.ws_connect(f"{responses_daemon.base_url}/v1/responses") as ws:
                await ws.send_json({**base, "generate": False, "input": [developer]})
                prewarm = await receive_until_done(ws)
                await ws.send_json({**base, "previous_response_id": prewarm[-1]["response"]["id"],
                                    "input": [{"role": "user", "content": "Say hello."}]})
                return prewarm, await receive_until_done(ws)

    prewarm, turn = asyncio.run(main())
    assert [f["type"] for f in prewarm] == ["response.created", "response.completed"]
    assert turn[0]["type"] == "response.created" and turn[-1]["type"] == "response.incomplete"
    assert turn[-1]["response"]["usage"]["output_tokens"] == MAX_OUT


def test_websocket_streams_multiplex_and_cancel_on_a_real_daemon(responses_daemon: Daemon) -> None:
    """Frames as Codex and OpenAI's WebSocket mode send them, against the daemon and its engine: two streams
    at once, an acknowledgement that draws no answer, one stream cancelled while the other completes."""
    base = {"type": "response.create", "model": TINY, "store": False, "temperature": 0}
    terminal = ("response.completed", "response.incomplete", "response.failed", "error")

    async def main():
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer test-key"}) as session:
            async with session.ws_connect(f"{responses_daemon.base_url}/v1/responses") as ws:
                await ws.send_json({**base, "stream_id": "a", "max_output_tokens": MAX_OUT, "input": "Say hello."})
                await ws.send_json({"type": "response.processed", "response_id": "resp_earlier"})
                await ws.send_json({**base, "stream_id": "b", "max_output_tokens": CONTEXT // 2,
                                    "input": "Count to a thousand."})
                frames, cancelled = [], False
                while len([f for f in frames if f["type"] in terminal]) < 2:
                    frames.append(await asyncio.wait_for(ws.receive_json(), 60))
                    if not cancelled and frames[-1]["type"] == "response.created" and frames[-1]["stream_id"] == "b":
                        await ws.send_json({"type": "response.cancel", "stream_id": "b"})
                        cancelled = True
                return frames

    frames = asyncio.run(main())
    ends = {f["stream_id"]: f for f in frames if f["type"] in terminal}
    assert all("stream_id" in f for f in frames)  # no untagged frame: the acknowledgement drew no error
    assert ends["a"]["type"] == "response.incomplete"  # stopped by max_output_tokens, as in the turn above
    assert ends["a"]["response"]["usage"]["output_tokens"] == MAX_OUT
    assert (ends["b"]["type"], ends["b"]["response"]["status"]) == ("response.incomplete", "cancelled")
    assert ends["b"]["response"]["usage"]["output_tokens"] < CONTEXT // 2
