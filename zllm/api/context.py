"""Typed keys for what the app shares with its handlers (aiohttp `AppKey`s)."""

from __future__ import annotations

from aiohttp import web

from zllm.api.stream_pump import KeepAlive
from zllm.canonical import EngineClient

ENGINE = web.AppKey("zllm.engine", EngineClient)
# how an idle SSE stream is kept alive (api/stream_pump.py: comments, heartbeat events)
SSE_KEEP_ALIVE = web.AppKey("zllm.sse_keep_alive", KeepAlive)


def engine_of(request: web.Request) -> EngineClient:
    return request.app[ENGINE]


def keep_alive_of(request: web.Request) -> KeepAlive:
    return request.app.get(SSE_KEEP_ALIVE, KeepAlive())
