"""Responses over a WebSocket (`GET /v1/responses`, `Upgrade: websocket`), as Codex uses it with
`supports_websockets = true`:

    → {"type": "response.create", "model": "m", "generate": false, "store": false, "input": [developer msg]}
    ← {"type": "response.created", …, "sequence_number": 0}   {"type": "response.completed", …}   (prewarm)
    → {"type": "response.create", "previous_response_id": "resp_A", "input": [only the new items], …}
    ← the same event objects as the SSE stream, one JSON text frame each
    → {"type": "bogus"}
    ← {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": null,
                                                 "message": "…", "param": "type"}}    (the socket stays open)

Frames are handled one at a time, in order. Each connection keeps its last responses in memory, stored or
not, so `previous_response_id` chains with `store: false` (Codex's default) work on that connection.
When disabled by config the upgrade is refused with 426 and Codex falls back to `POST /v1/responses`.
On daemon shutdown idle sockets are closed at once (1001 going away); busy ones after their response.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from zllm.api.auth import request_namespace
from zllm.api.cache_diagnostics import CacheDiagnostics, diagnostics_of
from zllm.api.context import engine_of
from zllm.api.errors import (
    ApiError,
    describe_exception,
    openai_error_body,
    uses_error_shape,
)
from zllm.api.json_body import BODY_PARSING
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.chain import ConnectionResponses, ResponseChain
from zllm.api.openai_responses.context import in_flight_of, seal_of, store_of
from zllm.api.openai_responses.in_flight import InFlightResponses
from zllm.api.openai_responses.turn import Turn, begin_turn
from zllm.api.sse import CLIENT_GONE
from zllm.canonical import EngineClient, Finished, RequestStream
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
                               diagnostics=diagnostics_of(request), app=request.app)
    sessions.open.add(session)
    try:
        await session.run()
    finally:
        sessions.open.discard(session)
    return ws


class WebSocketSession:
    """One connection. A reader task takes frames off the socket all the time, so a client that closes
    mid-response is noticed at once (its request is aborted), not only at the next failed write."""

    def __init__(self, ws: web.WebSocketResponse, engine: EngineClient, chain: ResponseChain, namespace: str,
                 in_flight: InFlightResponses, *, app: web.Application,
                 diagnostics: CacheDiagnostics | None = None):
        self.ws = ws
        self.app = app  # whose parse slots a big frame waits for
        self.diagnostics = diagnostics  # prompt fingerprints for `prompt_cache_diagnostics`
        self.engine = engine
        self.chain = chain
        self.namespace = namespace
        self.in_flight = in_flight  # where `POST /v1/responses/{id}/cancel` finds this socket's response
        self.busy = False
        self.closing = False
        self._inbox: asyncio.Queue[WSMessage | None] = asyncio.Queue()
        self._in_flight: RequestStream | None = None  # the unfinished request of the current turn

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read_frames())
        try:
            while not self.closing and (message := await self._inbox.get()) is not None:
                self.busy = True
                try:
                    await self._handle(message)
                finally:
                    self.busy = False
        finally:
            reader.cancel()
        if not self.ws.closed:
            await self.ws.close(code=WSCloseCode.GOING_AWAY if self.closing else WSCloseCode.OK)

    async def shutdown(self) -> None:
        self.closing = True
        if not self.busy:
            await self.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def _read_frames(self) -> None:
        try:
            async for message in self.ws:
                self._inbox.put_nowait(message)
        finally:
            self._inbox.put_nowait(None)
            if self._in_flight is not None:  # the client left mid-response
                self._in_flight.abort()
                log.info("websocket client disconnected; aborted %s", self._in_flight.request_id)

    async def _handle(self, message: WSMessage) -> None:
        if message.type == WSMsgType.TEXT:
            await self._create(message.data)
        elif message.type == WSMsgType.BINARY:
            await self._send_error(describe_exception(InvalidRequest("send JSON text frames, not binary")))

    async def _create(self, text: str) -> None:
        try:
            body = _create_body(await self.app[BODY_PARSING].parse(text))
            turn = await begin_turn(body, engine=self.engine, chain=self.chain, namespace=self.namespace,
                                    diagnostics=self.diagnostics)
        except Exception as exc:  # the client's mistake (or ours): answer in-band, keep the socket
            await self._send_error(describe_exception(exc))
            return
        if turn.stream is None:
            await self._send(turn.encoder.prewarm())
        else:
            with self.in_flight.track(turn, self.namespace):
                await self._pump(turn)

    async def _pump(self, turn: Turn) -> None:
        stream = self._in_flight = turn.stream
        try:
            await self._send(turn.encoder.start())
            async for event in stream:
                if isinstance(event, Finished):
                    self._in_flight = None  # from here on a hang-up is a normal end
                await self._send(turn.encoder.feed(event))
                if self._in_flight is None:
                    break
        except asyncio.CancelledError:  # handler cancellation: the connection dropped
            self._abort_in_flight()
            raise
        except CLIENT_GONE:  # a write found the socket closed; the reader ends the session
            self._abort_in_flight()
        except Exception as exc:  # a bug in the encoder or pump: report it in-band, never as a traceback
            self._abort_in_flight()
            await self._send_quietly(turn.encoder.fail(describe_exception(exc)))
        finally:
            self._in_flight = None

    def _abort_in_flight(self) -> None:
        if self._in_flight is not None:
            self._in_flight.abort()

    async def _send(self, events: list[dict]) -> None:
        for event in events:
            await self.ws.send_str(json.dumps(event, separators=(",", ":")))

    async def _send_quietly(self, events: list[dict]) -> None:
        try:
            await self._send(events)
        except CLIENT_GONE:
            pass

    async def _send_error(self, error: ApiError) -> None:
        await self._send_quietly([{"type": "error", "status": error.status, **openai_error_body(error)}])


def _create_body(frame: dict) -> dict:
    """The `response.create` fields (top-level, as Codex sends them; or nested under `response`)."""
    kind = frame.get("type")
    if kind != wire.WS_CREATE:
        raise InvalidRequest(f"unsupported client event type {kind!r}; expected {wire.WS_CREATE!r}", param="type")
    body = {key: value for key, value in frame.items() if key != "type"}
    nested = body.get("response")
    if isinstance(nested, dict) and "model" not in body:
        body = {**nested, **{k: v for k, v in body.items() if k != "response"}}
    return body
