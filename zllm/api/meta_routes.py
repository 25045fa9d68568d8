"""Routes every client shares: health and the model list.

    GET /health, /healthz  → 200 {"status": "ok", "models": ["smollm2"]}          (no API key needed)
    GET /v1/models         → {"object": "list", "data": [{"id": "smollm2", "object": "model",
                                                           "created": 1700000000, "owned_by": "zllm",
                                                           "context_length": 8192}]}
    GET /v1/models/{id}    → one of those objects, or 404 model_not_found

Model ids may contain "/" (Hugging Face style), so `{id}` matches the rest of the path.
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.context import engine_of
from zllm.api.errors import openai_error_body, uses_error_shape
from zllm.canonical import ModelCard
from zllm.errors import ModelNotFound


def openai_model(card: ModelCard) -> dict:
    # context_length is an extension (vLLM calls it max_model_len); the SDKs keep unknown fields
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": card.owned_by,
            "context_length": card.context_length}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "models": [card.id for card in engine_of(request).models()]})


@uses_error_shape(openai_error_body)
async def list_models(request: web.Request) -> web.Response:
    cards = engine_of(request).models()
    return web.json_response({"object": "list", "data": [openai_model(card) for card in cards]})


@uses_error_shape(openai_error_body)
async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    cards = engine_of(request).models()
    for card in cards:
        if card.id == model_id:
            return web.json_response(openai_model(card))
    raise ModelNotFound(model_id, available=[card.id for card in cards])


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
