"""`GET /v1/models` and `GET /v1/models/{id}` in Anthropic's shape, for requests with an `anthropic-version`
header (every Anthropic client sends one; OpenAI clients never do). meta_routes.py serves both shapes.

    {"data": [{"type": "model", "id": "tiny-qwen", "display_name": "tiny-qwen",
               "created_at": "2023-11-14T22:13:20Z", "lifecycle": "active",
               "max_input_tokens": 8192, "max_tokens": 8192}],
     "has_more": false, "first_id": "tiny-qwen", "last_id": "tiny-qwen"}

`limit`, `before_id` and `after_id` are accepted; zllm serves a handful of models, so one page holds all.
"""

from __future__ import annotations

import time

from aiohttp import web

from zllm.api.anthropic_messages import wire
from zllm.canonical import ModelCard


def speaks_anthropic(request: web.Request) -> bool:
    return wire.VERSION_HEADER in request.headers


def rfc3339(unix_seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_seconds))


def anthropic_model(card: ModelCard) -> dict:
    # max_tokens: the engine clamps output to what the window leaves, so the whole window is the honest bound
    return {"type": "model", "id": card.id, "display_name": card.id, "created_at": rfc3339(card.created),
            "lifecycle": "active", "max_input_tokens": card.context_length, "max_tokens": card.context_length}


def anthropic_model_list(cards: list[ModelCard]) -> dict:
    return {
        "data": [anthropic_model(card) for card in cards],
        "has_more": False,
        "first_id": cards[0].id if cards else None,
        "last_id": cards[-1].id if cards else None,
    }
