"""The Responses WebSocket's newer client frames over a real port, with frames shaped as Codex and OpenAI's
WebSocket mode send them: `stream_id` lanes, `response.cancel`, `response.processed`, `response.append`,
`response.steer`."""

from __future__ import annotations

import asyncio

from tests.support.fake_engine import text_events
from tests.unit.api.responses.test_responses_websocket import DEVELOPER, create, receive_response, run_ws, user
from zllm.canonical import Message

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
WORD_DELAY_S = 0.02


async def receive_until(ws, done) -> list[dict]:
    """Frames until `done(frames)` holds."""
    frames: list[dict] = []
    while not done(frames):
        frames.append(await asyncio.wait_for(ws.receive_json(), 10))
    return frames


def terminals(frames: list[dict]) -> dict[str | None, dict]:
    return {f.get("stream_id"): f for f in frames if f["type"] in TERMINAL or f["type"] == "error"}


def test_two_streams_run_side_by_side_and_every_frame_names_its_stream(server, engine):
    engine.script(text_events(*["a "] * 20), delay=WORD_DELAY_S)
    engine.script(text_events(*["b "] * 20), delay=WORD_DELAY_S)

    async def conversation(ws):
        await ws.send_json(create(stream_id="a", input=[user("first")]))
        await ws.send_json(create(stream_id="b", input=[user("second")]))
        return await receive_until(ws, lambda frames: len(terminals(frames)) == 2)

    frames = run_ws(server, conversation)
    ends = terminals(frames)
    assert {stream: end["type"] for stream, end in ends.items()} == {"a": "response.completed",
                                                                     "b": "response.completed"}
    assert all(frame["stream_id"] in ("a", "b") for frame in frames)
    order = [frame["stream_id"] for frame in frames]
    # interleaved: the second stream started before the first ended (one at a time would give a…a b…b)
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")
    for stream in ("a", "b"):
        own = [f for f in frames if f["stream_id"] == stream]
        assert [f["sequence_number"] for f in own] == list(range(len(own)))
        assert len({f["response"]["id"] for f in own if "response" in f}) == 1
    texts = {s: ends[s]["response"]["output"][0]["content"][0]["text"].split()[0] for s in ("a", "b")}
    assert sorted(texts.values()) == ["a", "b"]


def test_cancel_stops_one_stream_and_the_other_completes(server, engine):
    engine.script(text_events(*["slow "] * 500), delay=WORD_DELAY_S)  # 10 s unless cancelled
    engine.script(text_events(*["fast "] * 30), delay=WORD_DELAY_S)

    async def conversation(ws):
        await ws.send_json(create(stream_id="long", input=[user("one")]))
        await receive_until(ws, lambda frames: frames and frames[-1]["type"] == "response.output_text.delta")
        await ws.send_json(create(stream_id="short", input=[user("two")]))
        await ws.send_json({"type": "response.cancel", "stream_id": "long"})
        return await receive_until(ws, lambda frames: len(terminals(frames)) == 2)

    ends = terminals(run_ws(server, conversation))
    assert (ends["long"]["type"], ends["long"]["response"]["status"]) == ("response.incomplete", "cancelled")
    assert ends["short"]["type"] == "response.completed"
    assert engine.aborted == [engine.submitted[0].id]


def test_cancel_by_response_id_and_a_cancel_of_nothing_is_quiet(server, engine):
    engine.script(text_events(*["slow "] * 500), delay=WORD_DELAY_S)
    engine.script(text_events("next"))

    async def conversation(ws):
        await ws.send_json({"type": "response.cancel"})  # nothing running: no answer
        await ws.send_json(create(input=[user("one")]))
        head = await receive_until(ws, lambda frames: frames and frames[-1]["type"] == "response.output_text.delta")
        await ws.send_json({"type": "response.cancel", "response_id": head[0]["response"]["id"]})
        cancelled = await receive_response(ws)
        await ws.send_json(create(input=[user("two")]))
        return head + cancelled, await receive_response(ws)

    first, second = run_ws(server, conversation)
    assert first[0]["type"] == "response.created" and "stream_id" not in first[0]  # the default lane: untagged
    assert first[-1]["response"]["status"] == "cancelled"
    assert second[-1]["type"] == "response.completed"


def test_response_processed_draws_no_error(server, engine):
    async def conversation(ws):
        await ws.send_json(create(input=[user("hi")]))
        first = await receive_response(ws)
        await ws.send_json({"type": "response.processed", "response_id": first[-1]["response"]["id"]})
        await ws.send_json({"type": "response.processed", "stream_id": "x", "response_id": "resp_unknown"})
        await ws.send_json(create(input=[user("again")]))
        return await receive_response(ws)

    second = run_ws(server, conversation)
    # had either acknowledgement drawn an error event it would come first
    assert [f["type"] for f in second][0] == "response.created" and second[-1]["type"] == "response.completed"


def test_append_continues_the_streams_last_response_with_its_settings(server, engine):
    engine.script(text_events("Hello."))
    engine.script(text_events("Fine."))

    async def conversation(ws):
        await ws.send_json(create(stream_id="s", input=[DEVELOPER, user("hi")], max_output_tokens=7,
                                  tools=[{"type": "function", "name": "sh"}]))
        first = await receive_response(ws)
        await ws.send_json({"type": "response.append", "stream_id": "s", "input": [user("and now?")]})
        return first, await receive_response(ws)

    first, appended = run_ws(server, conversation)
    assert appended[-1]["type"] == "response.completed" and appended[-1]["stream_id"] == "s"
    assert appended[-1]["response"]["previous_response_id"] == first[-1]["response"]["id"]
    assert engine.submitted[1].messages == (Message("system", "You are Codex."), Message("user", "hi"),
                                            Message("assistant", "Hello."), Message("user", "and now?"))
    assert engine.submitted[1].sampling.max_tokens == 7 and [t.name for t in engine.submitted[1].tools] == ["sh"]


def test_append_without_a_response_before_it_is_an_error_on_its_stream(server, engine):
    async def conversation(ws):
        await ws.send_json({"type": "response.append", "stream_id": "fresh", "input": [user("x")]})
        return await receive_response(ws)

    (error,) = run_ws(server, conversation)
    assert (error["type"], error["stream_id"], error["error"]["param"]) == ("error", "fresh", "type")


def test_steer_is_refused_on_its_stream_and_the_running_response_goes_on(server, engine):
    engine.script(text_events(*["w "] * 30), delay=WORD_DELAY_S)

    async def conversation(ws):
        await ws.send_json(create(stream_id="main", input=[user("go")]))
        head = await receive_until(ws, lambda frames: frames and frames[-1]["type"] == "response.output_text.delta")
        await ws.send_json({"type": "response.steer", "stream_id": "main",
                            "previous_response_id": head[0]["response"]["id"], "input": "focus on tests"})
        return await receive_until(ws, lambda frames: any(f["type"] in TERMINAL for f in frames))

    frames = run_ws(server, conversation)
    (refusal,) = [f for f in frames if f["type"] == "response.steer.failed"]
    assert (refusal["stream_id"], refusal["error"]["code"]) == ("main", "steering_not_supported")
    assert frames[-1]["type"] == "response.completed"
    assert frames[-1]["response"]["output"][0]["content"][0]["text"] == "w " * 30


def test_a_bad_stream_id_is_an_error_and_the_socket_stays_open(server, engine):
    async def conversation(ws):
        await ws.send_json(create(stream_id="no spaces", input=[user("x")]))
        bad = await receive_response(ws)
        await ws.send_json(create(stream_id="ok-1.2_3", input=[user("x")]))
        return bad, await receive_response(ws)

    (bad,), good = run_ws(server, conversation)
    assert (bad["status"], bad["error"]["code"], bad["error"]["param"]) == (400, "invalid_stream_id", "stream_id")
    assert "stream_id" not in bad
    assert good[-1]["type"] == "response.completed" and good[-1]["stream_id"] == "ok-1.2_3"


def test_hanging_up_aborts_every_streams_response(server, engine):
    for _ in range(2):
        engine.script(text_events(*["t "] * 300), delay=WORD_DELAY_S)

    async def conversation(ws):
        await ws.send_json(create(stream_id="a", input=[user("1")]))
        await ws.send_json(create(stream_id="b", input=[user("2")]))
        await receive_until(ws, lambda frames: {f["stream_id"] for f in frames
                                                if f["type"] == "response.output_text.delta"} == {"a", "b"})

    run_ws(server, conversation)

    async def both_aborted() -> bool:
        for _ in range(250):
            if len(engine.aborted) == 2:
                return True
            await asyncio.sleep(0.02)
        return False

    assert asyncio.run(both_aborted())
    assert sorted(engine.aborted) == sorted(request.id for request in engine.submitted)


def test_frames_of_one_stream_still_run_in_order(server, engine):
    engine.script(text_events(*["one "] * 10), delay=WORD_DELAY_S)
    engine.script(text_events("two"))

    async def conversation(ws):
        await ws.send_json(create(input=[user("1")]))
        await ws.send_json(create(input=[user("2")]))
        return await receive_response(ws), await receive_response(ws)

    first, second = run_ws(server, conversation)
    assert first[-1]["response"]["output"][0]["content"][0]["text"] == "one " * 10
    assert second[0]["type"] == "response.created" and second[-1]["type"] == "response.completed"



def test_a_long_prefill_sends_in_progress_heartbeats_on_its_stream(serve, engine):
    # Codex closes a socket silent for `stream_idle_timeout_ms`: a slow first token must not look like that
    server = serve(engine, sse_event_heartbeat_s=0.1)
    engine.script(text_events("late"), delay=0.5)

    async def conversation(ws):
        await ws.send_json(create(stream_id="s", input=[user("hi")]))
        return await receive_until(ws, lambda frames: any(f["type"] in TERMINAL for f in frames))

    frames = run_ws(server, conversation)
    head = [f["type"] for f in frames[:frames.index(next(f for f in frames if "delta" in f["type"]))]]
    assert head[0] == "response.created" and head.count("response.in_progress") >= 3  # start's one + beats
    assert {f["stream_id"] for f in frames} == {"s"}
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    assert frames[-1]["type"] == "response.completed"
