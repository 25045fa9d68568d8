"""NDJSON streaming, as Ollama streams: one JSON object per line, `Content-Type: application/x-ndjson`.

A client that goes away (the handler is cancelled, or a write finds the socket closed) aborts the engine
request, as on the SSE APIs. There is no keep-alive: NDJSON has no comment line, and an empty line would
break clients that parse every line (the ollama package does). None is needed either: Ollama itself sends
nothing while it prefills, so its clients wait without an idle timeout (the ollama package's default is none).
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.ollama import wire
from zllm.api.ollama.encode import encode_line
from zllm.api.stream_pump import HttpStreamSink, KeepAlive, StreamEncoder, StreamPump
from zllm.canonical import RequestStream


class NdjsonWriter(HttpStreamSink):
    def __init__(self, request: web.Request):
        super().__init__(request, web.StreamResponse(status=200, headers={"Content-Type": wire.NDJSON}))

    def encode(self, frame: dict) -> bytes:
        return encode_line(frame)


async def stream_ndjson(request: web.Request, stream: RequestStream, encoder: StreamEncoder) -> web.StreamResponse:
    """Run `stream` out to the client as NDJSON. Aborts `stream` if the client goes away before it finished."""
    writer = NdjsonWriter(request)
    await StreamPump(stream, encoder, writer, KeepAlive.NONE).serve()
    return writer.response
