"""OpenAI Responses routes.

    POST   /v1/responses        → SSE (`event: response.created` / `data: {…}` …) or one JSON response object
    GET    /v1/responses        → WebSocket (`Upgrade: websocket`, see websocket.py); 426 when disabled by
                                  config (Codex then falls back to POST); 405 without an upgrade
    GET    /v1/responses/{id}   → the stored response object (404 for unknown ids and other API keys' ones)
    DELETE /v1/responses/{id}   → {"id": …, "object": "response", "deleted": true}
    POST   /v1/responses/{id}/cancel → the response object, status "cancelled" (see `cancel_response`)
    POST   /v1/responses/compact → {"object": "response.compaction", "output": [… a `compaction` item]}
                                  (compaction_turn.py; an input ending in `compaction_trigger` compacts on POST
                                  /v1/responses itself)

Errors before the first event (bad body, unknown previous_response_id, unknown model, prompt too long) are
plain HTTP errors in OpenAI's shape; the engine raises them from `submit`, so no broken stream is started.
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.auth import request_namespace
from zllm.api.cache_diagnostics import diagnostics_of
from zllm.api.context import engine_of, keep_alive_of
from zllm.api.errors import ApiError, openai_error_body, uses_error_shape
from zllm.api.json_body import read_json_object
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.chain import (
    BackgroundStore,
    ResponseChain,
    ResponseNotFound,
)
from zllm.api.openai_responses.compaction_seal import CompactionSeal
from zllm.api.openai_responses.compaction_turn import compact
from zllm.api.openai_responses.context import IN_FLIGHT, RESPONSES, SEAL, in_flight_of, seal_of, store_of
from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.in_flight import InFlightResponses
from zllm.api.openai_responses.turn import Turn, begin_turn, collect
from zllm.api.openai_responses.websocket import WebSocketSessions, responses_websocket
from zllm.api.sse import SseMessage, SsePayload, SseWriter, stream_sse
from zllm.canonical import Event
from zllm.errors import InvalidRequest
from zllm.store import ResponseStore

PATH = "/v1/responses"


@uses_error_shape(openai_error_body)
async def create_response(request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    namespace = request_namespace(request)
    chain = ResponseChain(store_of(request), seal=seal_of(request))
    turn = await begin_turn(body, engine=engine_of(request), chain=chain, namespace=namespace,
                            diagnostics=diagnostics_of(request))
    if turn.stream is None:  # `generate: false`: nothing runs, so nothing can be cancelled
        return await _send_prewarm(request, turn) if turn.call.stream else web.json_response(await collect(turn))
    with in_flight_of(request).track(turn, namespace):
        if not turn.call.stream:
            return web.json_response(await collect(turn))
        return await stream_sse(request, turn.stream, SseEvents(turn.encoder), keep_alive=keep_alive_of(request))


@uses_error_shape(openai_error_body)
async def compact_conversation(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    chain = ResponseChain(store_of(request), seal=seal_of(request))
    return web.json_response(await compact(body, engine=engine_of(request), chain=chain,
                                           namespace=request_namespace(request)))


async def _send_prewarm(request: web.Request, turn: Turn) -> web.StreamResponse:
    writer = SseWriter(request)
    await writer.open()
    await writer.send(_sse(event) for event in turn.encoder.prewarm())
    await writer.close()
    return writer.response


class SseEvents:
    """The encoder's event objects as SSE frames named by their type (as OpenAI sends them)."""

    def __init__(self, encoder: ResponseEventEncoder):
        self.encoder = encoder

    def start(self) -> list[SsePayload]:
        return [_sse(event) for event in self.encoder.start()]

    def feed(self, event: Event) -> list[SsePayload]:
        return [_sse(frame) for frame in self.encoder.feed(event)]

    def fail(self, error: ApiError) -> list[SsePayload]:
        return [_sse(event) for event in self.encoder.fail(error)]

    def heartbeat(self) -> list[SsePayload]:
        return [_sse(event) for event in self.encoder.heartbeat()]


def _sse(event: dict) -> SseMessage:
    return SseMessage(event, event=event["type"])


@uses_error_shape(openai_error_body)
async def retrieve_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    record = await store_of(request).load(response_id, request_namespace(request))
    if record is None:
        raise ResponseNotFound(response_id)
    return web.json_response(record.response)


@uses_error_shape(openai_error_body)
async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not await store_of(request).delete(response_id, request_namespace(request)):
        raise ResponseNotFound(response_id)
    return web.json_response({"id": response_id, "object": wire.RESPONSE, "deleted": True})


@uses_error_shape(openai_error_body)
async def cancel_response(request: web.Request) -> web.Response:
    """OpenAI cancels only `background: true` responses. zllm has no background mode: what runs long here are
    the responses it is generating for a waiting client (SSE, WebSocket or plain), so those are what cancel
    stops; their stream ends as cancelled and the call answers with the final, cancelled response.

    A response no longer running answers as OpenAI answers for a background one: a cancelled one is returned
    as is (cancelling twice is idempotent), one that ended any other way is a 400 ("Cannot cancel a completed
    response."), an unknown one (or another API key's, or one never stored) a 404.
    """
    response_id = request.match_info["response_id"]
    namespace = request_namespace(request)
    running = in_flight_of(request).find(response_id, namespace)
    if running is not None:
        return web.json_response(await running.cancel())
    record = await store_of(request).load(response_id, namespace)
    if record is None:
        raise ResponseNotFound(response_id)
    status = record.response["status"]
    if status != wire.STATUS_CANCELLED:
        raise InvalidRequest(f"Cannot cancel a {status} response.")
    return web.json_response(record.response)


def add_routes(app: web.Application, *, store: ResponseStore | None = None, websocket: bool = True,
               compaction_key: bytes | None = None) -> None:
    """`store=None`: an in-memory store that lives as long as the app (tests, and `store: true` without a
    state dir). A store passed in belongs to the caller, who closes it after the app has shut down.
    `compaction_key`: the install's key that signs compaction items (None: one for this app's life only)."""
    owned = store is None
    background = BackgroundStore(ResponseStore.in_memory() if owned else store)
    app[RESPONSES] = background
    app[SEAL] = CompactionSeal(compaction_key) if compaction_key else CompactionSeal.ephemeral()
    app[IN_FLIGHT] = InFlightResponses()
    sessions = WebSocketSessions.install(app, enabled=websocket)

    async def close_store(_app: web.Application) -> None:
        background.close()
        if owned:
            background.store.close()

    app.on_shutdown.append(sessions.shutdown)
    app.on_cleanup.append(close_store)
    app.router.add_post(PATH, create_response)
    app.router.add_post(PATH + "/compact", compact_conversation)  # before the {response_id} routes
    app.router.add_get(PATH, responses_websocket)
    app.router.add_get(PATH + "/{response_id}", retrieve_response)
    app.router.add_delete(PATH + "/{response_id}", delete_response)
    app.router.add_post(PATH + "/{response_id}/cancel", cancel_response)
