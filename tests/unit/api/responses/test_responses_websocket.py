"""Responses WebSocket mode (`GET /v1/responses` + upgrade), driven by aiohttp's client as Codex drives it."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.support.fake_engine import text_events, tool_call_events
from zllm.canonical import Message, ToolCall

DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}
HEADERS = {"Authorization": "Bearer test-key", "openai-beta": "responses_websockets=2026-02-06"}


def create(**fields) -> dict:
    return {"type": "response.create", "model": "fake-model", "store": False, "stream": True, **fields}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def receive_response(ws) -> list[dict]:
    """Frames until a terminal event or an error frame."""
    frames = []
    while True:
        frame = await asyncio.wait_for(ws.receive_json(), 10)
        frames.append(frame)
        if frame["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return frames


def run_ws(server, conversation):
    async def main():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{server.url}/v1/responses", headers=HEADERS) as ws:
                return await conversation(ws)

    return asyncio.run(main())


def test_prewarm_then_two_chained_turns_with_store_false(server, engine):
    engine.script(tool_call_events("sh", '{"cmd":"ls"}', text="Looking."))
    engine.script(text_events("Two files."))

    async def conversation(ws):
        await ws.send_json(create(generate=False, input=[DEVELOPER]))
        prewarm = await receive_response(ws)
        await ws.send_json(create(previous_response_id=prewarm[-1]["response"]["id"], input=[user("ls?")],
                                  tools=[{"type": "function", "name": "sh"}]))
        first = await receive_response(ws)
        call = first[-1]["response"]["output"][1]
        await ws.send_json(create(previous_response_id=first[-1]["response"]["id"], tools=[{"type": "function",
                                                                                              "name": "sh"}],
                                  input=[{"type": "function_call_output", "call_id": call["call_id"],
                                          "output": "a b"}]))
        return prewarm, first, await receive_response(ws), call

    prewarm, first, second, call = run_ws(server, conversation)
    assert [f["type"] for f in prewarm] == ["response.created", "response.completed"]
    assert prewarm[-1]["response"]["output"] == []
    assert first[0]["type"] == "response.created" and first[-1]["type"] == "response.completed"
    assert [f["sequence_number"] for f in first] == list(range(len(first)))
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "Two files."
    system, question = Message("system", "You are Codex."), Message("user", "ls?")
    assert engine.submitted[0].messages == (system, question)
    assert engine.submitted[1].messages == (
        system, question,
        Message("assistant", "Looking.", tool_calls=(ToolCall(call["call_id"], "sh", '{"cmd":"ls"}'),)),
        Message("tool", "a b", tool_call_id=call["call_id"], name="sh"),
    )


def test_an_error_frame_keeps_the_socket_open(server, engine):
    async def conversation(ws):
        await ws.send_str("{not json")
        bad_json = await receive_response(ws)
        await ws.send_json({"type": "response.bogus"})
        bad_type = await receive_response(ws)
        await ws.send_json(create(input="x", previous_response_id="resp_nope"))
        unknown = await receive_response(ws)
        await ws.send_json(create(input="hi"))
        return bad_json, bad_type, unknown, await receive_response(ws)

    bad_json, bad_type, unknown, good = run_ws(server, conversation)
    assert bad_json == [{"type": "error", "status": 400, "error": {
        "type": "invalid_request_error", "code": None, "param": None, "message": bad_json[0]["error"]["message"]}}]
    assert "not valid JSON" in bad_json[0]["error"]["message"]
    assert bad_type[0]["error"]["param"] == "type"
    assert (unknown[0]["status"], unknown[0]["error"]["code"]) == (404, "previous_response_not_found")
    assert good[-1]["type"] == "response.completed"


def test_store_false_chains_stay_on_their_connection(server, engine):
    async def first_connection(ws):
        await ws.send_json(create(input="hi"))
        return (await receive_response(ws))[-1]["response"]["id"]

    response_id = run_ws(server, first_connection)

    async def second_connection(ws):
        await ws.send_json(create(input="x", previous_response_id=response_id))
        return await receive_response(ws)

    (error,) = run_ws(server, second_connection)
    assert error["error"]["code"] == "previous_response_not_found"


def test_disabled_websocket_mode_is_426(serve, engine):
    server = serve(engine, websocket=False)

    async def main():
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(f"{server.url}/v1/responses", headers=HEADERS)
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status
        return None

    assert asyncio.run(main()) == 426
    # POST still works: Codex falls back to it
    from tests.unit.api.conftest import sdk_client

    assert sdk_client(server).responses.create(model="fake-model", input="hi").status == "completed"


def test_hanging_up_mid_response_aborts_it(server, engine):
    engine.script(text_events(*[f"t{i} " for i in range(300)]), delay=0.02)

    async def conversation(ws):
        await ws.send_json(create(input="hi"))
        while (await ws.receive_json())["type"] != "response.output_text.delta":
            pass

    run_ws(server, conversation)
    deadline = asyncio.run(_wait_for(lambda: engine.aborted == [engine.submitted[0].id]))
    assert deadline


async def _wait_for(condition, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


def test_shutdown_closes_an_idle_socket_as_going_away(engine):
    from tests.support.http_server import ThreadedServer
    from zllm.api import create_app

    server = ThreadedServer(create_app(engine)).start()

    async def conversation(ws):
        await ws.send_json(create(input="hi"))
        await receive_response(ws)
        stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
        message = await asyncio.wait_for(ws.receive(), 10)
        await stopping
        return message, ws.close_code

    message, close_code = run_ws(server, conversation)
    assert message.type == aiohttp.WSMsgType.CLOSE and close_code == aiohttp.WSCloseCode.GOING_AWAY
