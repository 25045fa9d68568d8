"""Ollama's model routes, over the served model (`EngineClient.models()`) and the store (`ModelLibrary`).

    GET  /, HEAD /      "Ollama is running" (clients probe it before anything else)
    GET  /api/version   {"version": "0.13.5"}
    GET  /api/tags      {"models": [{"name", "model", "modified_at", "size", "digest", "details"}]}  the store
    POST /api/show      {"modelfile", "parameters", "template", "details", "model_info", "capabilities", ...}
    GET  /api/ps        {"models": [{..., "expires_at", "size_vram", "context_length"}]}  the served model
    POST /api/embed, /api/embeddings   400: zllm serves no embedding models

Other `/api/*` paths answer 404 in Ollama's shape. `/api/pull` is in pull.py.
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.context import engine_of
from zllm.api.errors import uses_error_shape
from zllm.api.fields import required
from zllm.api.json_body import read_json_object
from zllm.api.ollama import wire
from zllm.api.ollama.encode import ollama_error_body, timestamp
from zllm.api.ollama.served import served_card
from zllm.canonical import ModelCard
from zllm.canonical.library import LibraryModel, ModelLibrary
from zllm.errors import InvalidRequest, ModelNotFound

LIBRARY = web.AppKey("zllm.model_library", object)

RUNNING = "Ollama is running"
# /api/ps: the served model stays loaded while the daemon runs; Ollama clients expect a time here
NEVER_EXPIRES = "2318-08-08T00:00:00Z"


def library_of(request: web.Request) -> ModelLibrary | None:
    return request.app.get(LIBRARY)


def stored_models(request: web.Request) -> list[LibraryModel]:
    library = library_of(request)
    return library.list_models() if library is not None else []


def _details(model: LibraryModel | None) -> dict:
    family = model.family if model else ""
    return {
        "parent_model": "",
        "format": model.weights_format if model else "",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": "",
        "quantization_level": model.quantization if model else "",
    }


def _entry(name: str, model: LibraryModel | None, card: ModelCard | None) -> dict:
    modified = model.modified_at if model else (card.created if card else None)
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp(modified),
        "size": model.size_bytes if model else 0,
        "digest": model.digest if model else "",
        "details": _details(model),
    }


async def root(request: web.Request) -> web.Response:
    return web.Response(text=RUNNING)


@uses_error_shape(ollama_error_body)
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": wire.API_VERSION})


@uses_error_shape(ollama_error_body)
async def tags(request: web.Request) -> web.Response:
    stored = {model.name: model for model in stored_models(request)}
    # the served model first, then the rest of the store; a model served from a path is listed too
    cards = engine_of(request).models()
    names = [card.id for card in cards] + [name for name in stored if name not in {c.id for c in cards}]
    by_card = {card.id: card for card in cards}
    return web.json_response({"models": [_entry(name, stored.get(name), by_card.get(name)) for name in names]})


@uses_error_shape(ollama_error_body)
async def ps(request: web.Request) -> web.Response:
    stored = {model.name: model for model in stored_models(request)}
    models = []
    for card in engine_of(request).models():
        entry = _entry(card.id, stored.get(card.id), card)
        models.append({**entry, "expires_at": NEVER_EXPIRES, "size_vram": 0, "context_length": card.context_length})
    return web.json_response({"models": models})


@uses_error_shape(ollama_error_body)
async def show(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    # "model" is the current field, "name" the old one some clients still send
    name = required(body, "model" if body.get("model") is not None else "name", "string")
    card = served_card(name, engine_of(request).models())
    stored = {model.name: model for model in stored_models(request)}
    model = stored.get(card.id if card else name) or stored.get(name.removesuffix(wire.DEFAULT_TAG))
    if card is None and model is None:
        raise ModelNotFound(name, available=list(stored))
    return web.json_response(_show_body(card.id if card else model.name, model, card))


def _show_body(name: str, model: LibraryModel | None, card: ModelCard | None) -> dict:
    family = (model.family if model else "") or "unknown"
    # the served window when it is served (what a client may send), else the model's own
    context = card.context_length if card else (model.context_length if model else None)
    info: dict = {"general.architecture": family, "general.basename": name}
    if context:
        info[f"{family}.context_length"] = context
    source = model.source if model else name
    return {
        "modelfile": f"# served by zllm\nFROM {source}\n",
        "parameters": "",
        "template": "",
        "details": _details(model),
        "model_info": info,
        # every model zllm serves takes tools (the dialect's, or fenced JSON); "thinking" depends on the family
        "capabilities": ["completion", "tools"],
        "modified_at": timestamp(model.modified_at if model else (card.created if card else None)),
    }


@uses_error_shape(ollama_error_body)
async def embed(request: web.Request) -> web.Response:
    raise InvalidRequest("embeddings are not supported: zllm serves generative models only")


@uses_error_shape(ollama_error_body)
async def unknown(request: web.Request) -> web.Response:
    raise web.HTTPNotFound(text=f"{request.method} {request.path} is not implemented by zllm")


def add_routes(app: web.Application, library: ModelLibrary | None) -> None:
    if library is not None:
        app[LIBRARY] = library
    app.router.add_get("/", root)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embed)


def add_fallback(app: web.Application) -> None:
    """After every other route: the rest of `/api/*` (create, copy, delete, push, blobs) answers in Ollama's shape."""
    app.router.add_route("*", "/api/{tail:.*}", unknown)
