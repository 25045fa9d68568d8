"""What the Responses routes share through the app (aiohttp `AppKey`s)."""

from __future__ import annotations

from aiohttp import web

from zllm.api.openai_responses.chain import BackgroundStore

RESPONSES = web.AppKey("zllm.responses.store", BackgroundStore)


def store_of(request: web.Request) -> BackgroundStore:
    return request.app[RESPONSES]
