"""Responses over a WebSocket (`GET /v1/responses`, `Upgrade: websocket`), as Codex uses it with
`supports_websockets = true`:

    → {"type": "response.create", "model": "m", "generate": false, "store": false, "input": [developer msg]}
    ← {"type": "response.created", …, "sequence_number": 0}   {"type": "response.completed", …}   (prewarm)
    → {"type": "response.create", "previous_response_id": "resp_A", "input": [only the new items], …}
    ← the same event objects as the SSE stream, one JSON text frame each
    → {"type": "response.processed", "response_id": "resp_B"}          (no answer)
    → {"type": "response.append", "input": [only the new items]}       (continues resp_B, same settings)
    → {"type": "bogus"}
    ← {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": null,
                                                 "message": "…", "param": "type"}}    (the socket stays open)

Multiplexed (`stream_id`, OpenAI's WebSocket mode): responses on different streams run side by side, each
frame of one tagged with its stream, and `response.cancel` stops one stream's response:

    → {"type": "response.create", "stream_id": "a", …}   → {"type": "response.create", "stream_id": "b", …}
    ← {"type": "response.created", "stream_id": "a", …}  ← {"type": "response.created", "stream_id": "b", …} …
    → {"type": "response.cancel", "stream_id": "b"}
    ← {"type": "response.incomplete", "stream_id": "b", "response": {"status": "cancelled", …}}

Frames of one stream (the default one, without `stream_id`, included) are handled one at a time, in order
(websocket_frames.py says what each client frame does). Each connection keeps its last responses in memory,
stored or not, so `previous_response_id` chains with `store: false` (Codex's default) work on that connection,
across its streams (a fork chains a new stream to another's response). When disabled by config the upgrade is
refused with 426 and Codex falls back to `POST /v1/responses`. On daemon shutdown idle sockets are closed at
once (1001 going away); busy ones after their responses (frames not yet started are dropped).
While a response sends nothing (a long prefill), its `response.in_progress` repeats once a minute (the
stream pump's event heartbeat, `sse_event_heartbeat_s`, api/stream_pump.py): Codex's watchdog closes a socket
silent for `stream_idle_timeout_ms` (300 s by default) and retries the turn from scratch.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from zllm.api.auth import request_namespace
from zllm.api.cache_diagnostics import CacheDiagnostics, diagnostics_of
from zllm.api.context import engine_of, keep_alive_of
from zllm.api.errors import (
    describe_exception,
    openai_error_body,
    uses_error_shape,
)
from zllm.api.json_body import BODY_PARSING
from zllm.api.openai_responses import websocket_frames as frames
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.chain import ConnectionResponses, ResponseChain
from zllm.api.openai_responses.context import in_flight_of, seal_of, store_of
from zllm.api.openai_responses.in_flight import InFlightResponse, InFlightResponses
from zllm.api.openai_responses.turn import Turn, begin_turn
from zllm.api.stream_pump import CLIENT_GONE, FrameSink, KeepAlive, StreamPump
from zllm.canonical import EngineClient
from zllm.errors import InvalidRequest

log = logging.getLogger("zllm.api")

# a first turn may carry a whole conversation (the same bound as HTTP bodies)
MAX_FRAME_BYTES = 64 * 1024 * 1024


class WebSocketSessions:
    """Whether WebSockets are enabled, and the open sessions (to close them on shutdown)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.open: set[WebSocketSession] = set()

    @classmethod
    def install(cls, app: web.Application, *, enabled: bool) -> WebSocketSessions:
        sessions = app[SESSIONS] = cls(enabled)
        return sessions

    async def shutdown(self, _app: web.Application) -> None:
        await asyncio.gather(*(session.shutdown() for session in list(self.open)))


SESSIONS = web.AppKey("zllm.responses.websockets", WebSocketSessions)


@uses_error_shape(openai_error_body)
async def responses_websocket(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise web.HTTPMethodNotAllowed("GET", ["POST"], text="GET /v1/responses needs `Upgrade: websocket`; "
                                                               "create responses with POST /v1/responses")
    sessions = request.app[SESSIONS]
    if not sessions.enabled:
        raise web.HTTPUpgradeRequired(text="Responses WebSocket mode is disabled on this server; "
                                           "use POST /v1/responses")
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES)
    await ws.prepare(request)
    chain = ResponseChain(store_of(request), ConnectionResponses(), seal=seal_of(request))
    session = WebSocketSession(ws, engine_of(request), chain, request_namespace(request), in_flight_of(request),
                               diagnostics=diagnostics_of(request), app=request.app,
                               heartbeat_s=keep_alive_of(request).event_s)
    sessions.open.add(session)
    try:
        await session.run()
    finally:
        sessions.open.discard(session)
    return ws


class WebSocketSession:
    """One connection. A reader task takes frames off the socket all the time, so a client that closes
    mid-response is noticed at once (its requests are aborted), not only at the next failed write. Frames are
    dispatched in order: control frames (cancel, processed, steer) act at once; creates and appends queue on
    their lane (`stream_id`), each lane running one response at a time, lanes side by side."""

    def __init__(self, ws: web.WebSocketResponse, engine: EngineClient, chain: ResponseChain, namespace: str,
                 in_flight: InFlightResponses, *, app: web.Application,
                 diagnostics: CacheDiagnostics | None = None, heartbeat_s: float | None = None):
        self.ws = ws
        # a response's `response.in_progress` again after this long without a frame of it (a long prefill):
        # Codex's watchdog (`stream_idle_timeout_ms`, 300 s) closes a socket that stays silent, as on SSE
        self.heartbeat_s = heartbeat_s
        self.app = app  # whose parse slots a big frame waits for
        self.diagnostics = diagnostics  # prompt fingerprints for `prompt_cache_diagnostics`
        self.engine = engine
        self.chain = chain
        self.namespace = namespace
        self.in_flight = in_flight  # where `POST /v1/responses/{id}/cancel` finds this socket's responses
        self.closing = False
        self._inbox: asyncio.Queue[WSMessage | None] = asyncio.Queue()
        self._lanes: dict[str | None, Lane] = {}
        self._writing = asyncio.Lock()  # one frame at a time from every lane

    @property
    def busy(self) -> bool:
        return any(lane.busy for lane in self._lanes.values())

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read_frames())
        try:
            while not self.closing and (message := await self._inbox.get()) is not None:
                await self._dispatch(message)
        finally:
            reader.cancel()
            # queued frames are dropped; responses under way finish (shutdown) or were aborted (hang-up)
            await asyncio.gather(*(lane.finish() for lane in self._lanes.values()), return_exceptions=True)
        if not self.ws.closed:
            await self.ws.close(code=WSCloseCode.GOING_AWAY if self.closing else WSCloseCode.OK)

    async def shutdown(self) -> None:
        self.closing = True
        if not self.busy:
            await self.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
        self._inbox.put_nowait(None)  # wakes `run`, which waits for the responses under way

    async def _read_frames(self) -> None:
        try:
            async for message in self.ws:
                self._inbox.put_nowait(message)
        finally:
            self._inbox.put_nowait(None)
            for lane in self._lanes.values():  # the client left mid-response
                lane.abort()

    # ---------------------------------------------------------------- dispatch

    async def _dispatch(self, message: WSMessage) -> None:
        if message.type == WSMsgType.BINARY:
            self._default_lane().enqueue(self._job_error(InvalidRequest("send JSON text frames, not binary")))
            return
        if message.type != WSMsgType.TEXT:
            return
        try:
            frame = await self.app[BODY_PARSING].parse(message.data)
            stream_id = frames.stream_id_of(frame)
        except Exception as exc:  # answered on the default lane, in order with what it already runs
            self._default_lane().enqueue(self._job_error(exc))
            return
        kind = frame.get("type")
        if kind == wire.WS_PROCESSED:
            return  # Codex acknowledging a response it has handled: nothing to do, nothing to answer
        if kind == wire.WS_CANCEL:
            self._cancel(stream_id, frame.get("response_id"))
            return
        try:
            lane = self._lane(stream_id)
        except frames.FrameError as exc:
            self._default_lane().enqueue(self._job_error(exc))
            return
        if kind == wire.WS_STEER:
            await self._send_quietly([frames.steer_refusal(frame)], lane.stream_id)
        elif kind in (wire.WS_CREATE, wire.WS_APPEND):
            lane.enqueue(lambda: self._respond(lane, frame))
        else:
            lane.enqueue(self._job_error(frames.unknown_type(kind), lane.stream_id))

    def _lane(self, stream_id: str | None) -> Lane:
        lane = self._lanes.get(stream_id)
        if lane is None:
            if stream_id is not None and len(self._lanes) - (None in self._lanes) >= frames.MAX_NAMED_STREAMS:
                raise frames.too_many_streams()
            lane = self._lanes[stream_id] = Lane(stream_id)
        return lane

    def _default_lane(self) -> Lane:
        return self._lane(None)

    def _cancel(self, stream_id: str | None, response_id: object) -> None:
        """Stop the named response, else the lane's running one; its terminal event (`status: cancelled`) ends
        its stream. Nothing running is nothing to do: the response may have just finished."""
        lanes = list(self._lanes.values()) if isinstance(response_id, str) else [self._lanes.get(stream_id)]
        for lane in lanes:
            running = lane.running if lane is not None else None
            if running is not None and (not isinstance(response_id, str)
                                        or running.encoder.response["id"] == response_id):
                running.stop()

    # ---------------------------------------------------------------- one response

    async def _respond(self, lane: Lane, frame: dict) -> None:
        try:
            if frame.get("type") == wire.WS_APPEND:
                body = frames.append_body(frame, lane.last_create, lane.last_response_id)
            else:
                body = frames.create_body(frame)
            turn = await begin_turn(body, engine=self.engine, chain=self.chain, namespace=self.namespace,
                                    diagnostics=self.diagnostics)
        except Exception as exc:  # the client's mistake (or ours): answer in-band, keep the socket
            await self._send_error(exc, lane.stream_id)
            return
        lane.last_create = body
        if turn.stream is None:
            await self._send(turn.encoder.prewarm(), lane.stream_id)
        else:
            with self.in_flight.track(turn, self.namespace) as entry:
                lane.running = entry
                try:
                    await self._pump(turn, lane)
                finally:
                    lane.running = None
        lane.last_response_id = turn.encoder.response["id"]

    async def _pump(self, turn: Turn, lane: Lane) -> None:
        # the heartbeat alone keeps a response alive here: a WebSocket has no comment frame
        keep_alive = KeepAlive(comment_s=None, event_s=self.heartbeat_s)
        pump = StreamPump(turn.stream, turn.encoder, _LaneSink(self, lane.stream_id), keep_alive,
                          on_finished=lane.release)  # from Finished on, a hang-up is a normal end
        await pump.serve()

    # ---------------------------------------------------------------- writing

    async def _send(self, events: list[dict], stream_id: str | None) -> None:
        tag = {} if stream_id is None else {wire.WS_STREAM_ID: stream_id}
        async with self._writing:
            for event in events:
                await self.ws.send_str(json.dumps({**event, **tag}, separators=(",", ":")))

    async def _send_quietly(self, events: list[dict], stream_id: str | None) -> None:
        try:
            await self._send(events, stream_id)
        except CLIENT_GONE:
            pass

    async def _send_error(self, exc: BaseException, stream_id: str | None) -> None:
        error = exc.error if isinstance(exc, frames.FrameError) else describe_exception(exc)
        await self._send_quietly([{"type": "error", "status": error.status, **openai_error_body(error)}], stream_id)

    def _job_error(self, exc: BaseException, stream_id: str | None = None) -> Callable[[], Awaitable[None]]:
        return lambda: self._send_error(exc, stream_id)


class _LaneSink(FrameSink):
    """A response's frames on its lane's stream of the socket."""

    def __init__(self, session: WebSocketSession, stream_id: str | None):
        self.session = session
        self.stream_id = stream_id

    async def send(self, frames: list) -> None:
        await self.session._send(frames, self.stream_id)


class Lane:
    """One `stream_id` of a connection: its frames in order, one response at a time, and what an append
    continues from. A worker task runs only while the lane has jobs (an idle socket holds no task)."""

    def __init__(self, stream_id: str | None):
        self.stream_id = stream_id
        self.running: InFlightResponse | None = None  # the response being generated
        self.last_create: dict | None = None          # the settings `response.append` reuses
        self.last_response_id: str | None = None      # what `response.append` chains to
        self._jobs: collections.deque[Callable[[], Awaitable[None]]] = collections.deque()
        self._worker: asyncio.Future | None = None

    @property
    def busy(self) -> bool:
        return self._worker is not None and not self._worker.done()

    def enqueue(self, job: Callable[[], Awaitable[None]]) -> None:
        self._jobs.append(job)
        if not self.busy:
            self._worker = asyncio.ensure_future(self._work())

    def abort(self) -> None:
        if self.running is not None:
            self.running.stream.abort()

    def release(self) -> None:
        """The running response has finished: nothing left to cancel or abort."""
        self.running = None

    async def finish(self) -> None:
        """Drop what has not started, let the running job end."""
        self._jobs.clear()
        if self._worker is not None:
            await self._worker

    async def _work(self) -> None:
        while self._jobs:
            try:
                await self._jobs.popleft()()
            except Exception:  # every job answers its own errors; this is a bug, and the lane goes on
                log.exception("websocket lane %r: a job failed", self.stream_id)
