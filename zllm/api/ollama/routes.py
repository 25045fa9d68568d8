"""`POST /api/chat` and `POST /api/generate`: decode → `engine.submit` → NDJSON stream or one JSON object.

Errors before the first event (bad request, unknown model, prompt too long, overloaded) are plain HTTP
errors in Ollama's shape, `{"error": "..."}` with the status the other APIs use (400, 404, 503).
The model is the served one by its zllm name; `NAME:latest` is the same model, as Ollama names it.
"""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from zllm import ids
from zllm.api.auth import request_namespace
from zllm.api.collect import run_to_finish
from zllm.api.context import engine_of
from zllm.api.errors import uses_error_shape
from zllm.api.json_body import read_json_object
from zllm.api.ollama import model_routes, pull
from zllm.api.ollama.decode import OllamaCall, decode_chat, decode_generate
from zllm.api.ollama.encode import (
    Kind,
    OllamaStreamEncoder,
    Timings,
    load_answer,
    ollama_error_body,
)
from zllm.api.ollama.ndjson import stream_ndjson
from zllm.api.ollama.reply import OllamaReplyBuilder
from zllm.api.ollama.served import served_card
from zllm.canonical.library import ModelLibrary
from zllm.errors import ModelNotFound


@uses_error_shape(ollama_error_body)
async def chat(request: web.Request) -> web.StreamResponse:
    timings = Timings()
    body = await read_json_object(request)
    call = decode_chat(body, request_id=ids.request_id(), namespace=request_namespace(request))
    return await _answer(request, call, "chat", timings)


@uses_error_shape(ollama_error_body)
async def generate(request: web.Request) -> web.StreamResponse:
    timings = Timings()
    body = await read_json_object(request)
    call = decode_generate(body, request_id=ids.request_id(), namespace=request_namespace(request))
    return await _answer(request, call, "generate", timings)


async def _answer(request: web.Request, call: OllamaCall, kind: Kind, timings: Timings) -> web.StreamResponse:
    engine = engine_of(request)
    cards = engine.models()
    card = served_card(call.model, cards)
    if card is None:
        raise ModelNotFound(call.model, available=[c.id for c in cards])
    if call.request is None:
        return web.json_response(load_answer(kind, call.model))
    stream = await engine.submit(replace(call.request, model=card.id))
    # the answer names the model as the client did, as Ollama does
    if call.stream:
        encoder = OllamaStreamEncoder(kind=kind, model=call.model, timings=timings)
        return await stream_ndjson(request, stream, encoder)
    builder = OllamaReplyBuilder(kind=kind, model=call.model, timings=timings)
    await run_to_finish(stream, builder.feed)
    return web.json_response(builder.result())


def add_routes(app: web.Application, *, library: ModelLibrary | None = None) -> None:
    """Every Ollama route; `library` (the model store) backs /api/tags, /api/show and /api/pull."""
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    model_routes.add_routes(app, library)
    pull.add_routes(app, library)
    model_routes.add_fallback(app)
