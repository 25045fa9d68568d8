"""Server-sent events: the frames, the writer, and `stream_sse`, which runs one request's events out to the client.

Frames on the wire (an `event:` line only when a protocol names its events, as Anthropic's must):

    HTTP/1.1 200 OK
    Content-Type: text/event-stream
    Cache-Control: no-cache

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk",…}

    event: message_start
    data: {"type":"message_start",…}

    : keep-alive

    data: [DONE]

While no event comes the pump (api/stream_pump.py) keeps the stream alive with a `: keep-alive` comment every
15 s and, once a minute, the encoder's `heartbeat()` event; a client that goes away aborts the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from zllm.api.stream_pump import HttpStreamSink, KeepAlive, StreamEncoder, StreamPump
from zllm.canonical import RequestStream


@dataclass(frozen=True)
class SseMessage:
    """A frame with an `event:` name. Encoders may also yield a bare dict or str for a data-only frame."""

    data: dict | str
    event: str | None = None


SsePayload = SseMessage | dict | str


def encode_frame(payload: SsePayload) -> bytes:
    message = payload if isinstance(payload, SseMessage) else SseMessage(payload)
    data = message.data if isinstance(message.data, str) else json.dumps(message.data, separators=(",", ":"))
    head = f"event: {message.event}\n" if message.event else ""
    # json.dumps never emits a raw newline, so one data: line is always enough for JSON payloads.
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}{lines}\n".encode()


class _EventStreamResponse(web.StreamResponse):
    # Hold the headers back until the first frame so both leave in one write: a client's first read then
    # already shows the stream has started. (aiohttp's own flag; without it the headers just go out alone.)
    _send_headers_immediately = False


class SseWriter(HttpStreamSink):
    def __init__(self, request: web.Request):
        super().__init__(request, _EventStreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                # tells reverse proxies (nginx) not to buffer the stream
                "X-Accel-Buffering": "no",
            },
        ))

    def encode(self, frame: SsePayload) -> bytes:
        return encode_frame(frame)

    async def send_filler(self) -> None:
        await self.response.write(b": keep-alive\n\n")


async def stream_sse(
    request: web.Request,
    stream: RequestStream,
    encoder: StreamEncoder,
    *,
    keep_alive: KeepAlive | None = None,
) -> web.StreamResponse:
    """Run `stream` out to the client as SSE. Aborts `stream` if the client goes away before it finished.
    `keep_alive`: how an idle stream is kept alive (api/stream_pump.py; None: the defaults)."""
    writer = SseWriter(request)
    await StreamPump(stream, encoder, writer, keep_alive or KeepAlive()).serve()
    return writer.response
