"""Routes every client shares: health and the model list.

    GET /health, /healthz  → 200 {"status": "ok", "models": ["smollm2"]}          (no API key needed)
    GET /v1/models         → {"object": "list", "data": [{"id": "smollm2", "object": "model",
                                                           "created": 1700000000, "owned_by": "zllm",
                                                           "context_length": 8192}]}
    GET /v1/models?client_version=0.171.0   (Codex's model discovery; also GET /models)
                           → the same list, plus `"models": [ModelInfo, …]`: Codex's own catalog
                             (zllm/codex_models.py) with the real window, when to compact and the tools the
                             model handles. Codex ignores `object`/`data`, the SDKs ignore `models`.
    GET /v1/models/{id}    → one of those objects, or 404 model_not_found

With an `anthropic-version` header (Anthropic clients) both answer, and fail, in Anthropic's shape instead
(anthropic_messages/models.py).

Model ids may contain "/" (Hugging Face style), so `{id}` matches the rest of the path.
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.anthropic_messages.models import (
    anthropic_model,
    anthropic_model_list,
    speaks_anthropic,
)
from zllm.codex_models import codex_models
from zllm.api.context import engine_of
from zllm.api.errors import (
    ErrorShape,
    anthropic_error_body,
    chooses_error_shape,
    openai_error_body,
)
from zllm.canonical import ModelCard
from zllm.errors import ModelNotFound


# the query parameter Codex's `GET {base_url}/models` carries (and no other client sends)
CODEX_DISCOVERY = "client_version"


def openai_model(card: ModelCard) -> dict:
    # context_length is an extension (vLLM calls it max_model_len); the SDKs keep unknown fields
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": card.owned_by,
            "context_length": card.context_length}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "models": [card.id for card in engine_of(request).models()]})


def _error_shape(request: web.Request) -> ErrorShape:
    return anthropic_error_body if speaks_anthropic(request) else openai_error_body


@chooses_error_shape(_error_shape)
async def list_models(request: web.Request) -> web.Response:
    cards = engine_of(request).models()
    if speaks_anthropic(request):
        return web.json_response(anthropic_model_list(cards))
    body = {"object": "list", "data": [openai_model(card) for card in cards]}
    if CODEX_DISCOVERY in request.query:
        body |= codex_models([(card.id, card.context_length) for card in cards])
    return web.json_response(body)


@chooses_error_shape(_error_shape)
async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    cards = engine_of(request).models()
    for card in cards:
        if card.id == model_id:
            return web.json_response(anthropic_model(card) if speaks_anthropic(request) else openai_model(card))
    raise ModelNotFound(model_id, available=[card.id for card in cards])


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/models", list_models)
    # Codex asks `{base_url}/models`; the list answers without the /v1 prefix too, as gateways serve it
    app.router.add_get("/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
