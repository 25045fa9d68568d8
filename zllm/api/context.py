"""Typed keys for what the app shares with its handlers (aiohttp `AppKey`s)."""

from __future__ import annotations

from aiohttp import web

from zllm.canonical import EngineClient

ENGINE = web.AppKey("zllm.engine", EngineClient)
# seconds without an event before an SSE stream sends a keep-alive comment; None = never
SSE_HEARTBEAT_S = web.AppKey("zllm.sse_heartbeat_s", float)


def engine_of(request: web.Request) -> EngineClient:
    return request.app[ENGINE]


def heartbeat_of(request: web.Request) -> float | None:
    return request.app.get(SSE_HEARTBEAT_S)
