"""NDJSON streaming, as Ollama streams: one JSON object per line, `Content-Type: application/x-ndjson`.

A client that goes away (the handler is cancelled, or a write finds the socket closed) aborts the engine
request, as on the SSE APIs. There is no keep-alive: NDJSON has no comment line, and an empty line would
break clients that parse every line (the ollama package does). None is needed either: Ollama itself sends
nothing while it prefills, so its clients wait without an idle timeout (the ollama package's default is none).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from aiohttp import web

from zllm.api.errors import ApiError, describe_exception
from zllm.api.ollama import wire
from zllm.api.ollama.encode import encode_line
from zllm.api.sse import CLIENT_GONE
from zllm.canonical import Event, Finished, RequestStream

log = logging.getLogger("zllm.api")


class NdjsonWriter:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers={"Content-Type": wire.NDJSON})

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, objects: Iterable[dict]) -> None:
        data = b"".join(encode_line(obj) for obj in objects)
        if data:
            await self.response.write(data)

    async def close(self) -> None:
        try:
            await self.response.write_eof()
        except CLIENT_GONE:
            pass


class LineEncoder(Protocol):
    def feed(self, event: Event) -> list[dict]: ...

    def fail(self, error: ApiError) -> list[dict]: ...


async def stream_ndjson(request: web.Request, stream: RequestStream, encoder: LineEncoder) -> web.StreamResponse:
    """Run `stream` out to the client as NDJSON. Aborts `stream` if the client goes away before it finished."""
    writer = NdjsonWriter(request)
    finished = False

    def abort_unfinished() -> None:
        if not finished:
            stream.abort()
            log.info("client disconnected; aborted %s", stream.request_id)

    try:
        await writer.open()
        async for event in stream:
            finished = isinstance(event, Finished)
            await writer.send(encoder.feed(event))
            if finished:
                break
        await writer.close()
    except asyncio.CancelledError:
        abort_unfinished()
        raise
    except CLIENT_GONE:
        abort_unfinished()
    except Exception as exc:  # a bug in the encoder: report it in-stream, never as a traceback
        abort_unfinished()
        try:
            await writer.send(encoder.fail(describe_exception(exc)))
            await writer.close()
        except CLIENT_GONE:
            pass
    return writer.response
