"""Server-sent events: the writer, and the pump that runs one request's events out to the client.

Frames on the wire (an `event:` line only when a protocol names its events, as Anthropic's must):

    HTTP/1.1 200 OK
    Content-Type: text/event-stream
    Cache-Control: no-cache

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk",…}

    event: message_start
    data: {"type":"message_start",…}

    : keep-alive

    data: [DONE]

While no event comes (a long prefill, a wait in the queue) the pump keeps the stream alive two ways: an SSE
comment every `heartbeat_s` (15 s: idle-timeout proxies, and a write that notices a vanished client), and
once a minute (`event_heartbeat_s`) the encoder's `heartbeat()` instead: a real event of the protocol that
changes nothing a client accumulates. Clients' stream watchdogs count only events, never comments: Claude
Code aborts a stream after 300 s without one (it ignores `ping` too; the floor cannot be lowered) and Codex
after its `stream_idle_timeout_ms` (300 s by default), so a cold prefill longer than that would otherwise be
retried from the start, again and again. An encoder with nothing harmless to send at that point returns []
and the comment goes out instead.

A client that goes away (the handler is cancelled, or a write finds the socket closed) aborts the engine
request and ends the handler quietly: a hang-up is normal for streaming clients, not an error to log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from zllm.api.errors import ApiError, describe_exception
from zllm.canonical import Event, Finished, RequestStream

log = logging.getLogger("zllm.api")

# ClientConnectionResetError (aiohttp's "Cannot write to closing transport") subclasses ConnectionResetError.
CLIENT_GONE = (ConnectionResetError, BrokenPipeError)

DEFAULT_HEARTBEAT_S = 15.0  # an SSE comment after this long without a frame
# a protocol heartbeat event (StreamEncoder.heartbeat) after this long without one: well inside the 300 s
# watchdogs of Claude Code and Codex, and rare because Claude Code adds the usage of every message_delta to
# its session cost (anthropic_messages/encode.py)
DEFAULT_EVENT_HEARTBEAT_S = 60.0


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


class SseWriter:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = _EventStreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                # tells reverse proxies (nginx) not to buffer the stream
                "X-Accel-Buffering": "no",
            },
        )

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, payloads: Iterable[SsePayload]) -> None:
        data = b"".join(encode_frame(p) for p in payloads)
        if data:
            await self.response.write(data)

    async def send_comment(self, text: str) -> None:
        await self.response.write(f": {text}\n\n".encode())

    async def close(self) -> None:
        try:
            await self.response.write_eof()
        except CLIENT_GONE:
            pass  # some clients (Codex) hang up right after the last event, before the chunked terminator


class StreamEncoder(Protocol):
    """A protocol's streaming state machine: canonical events in, SSE payloads out."""

    def start(self) -> list[SsePayload]: ...

    def feed(self, event: Event) -> list[SsePayload]: ...

    def fail(self, error: ApiError) -> list[SsePayload]:
        """Payloads that report `error` to the client mid-stream."""
        ...

    def heartbeat(self) -> list[SsePayload]:
        """An event that clients' idle watchdogs count and that changes nothing they accumulate (the
        answer's text, calls, stop reason or usage), valid at this point of the stream; [] when there is none."""
        ...


async def stream_sse(
    request: web.Request,
    stream: RequestStream,
    encoder: StreamEncoder,
    *,
    keep_alive: KeepAlive | None = None,
) -> web.StreamResponse:
    """Run `stream` out to the client as SSE. Aborts `stream` if the client goes away before it finished.
    `keep_alive`: how an idle stream is kept alive (the module docstring; None: the defaults)."""
    pump = _SsePump(stream, SseWriter(request), encoder, keep_alive or KeepAlive())
    try:
        await pump.run()
    except asyncio.CancelledError:
        # handler_cancellation: aiohttp cancels the handler when the connection drops.
        pump.abort_unfinished()
        raise
    except CLIENT_GONE:
        pump.abort_unfinished()
    except Exception as exc:  # a bug in the pump or encoder: report it in-stream, never as a traceback
        pump.abort_unfinished()
        await pump.report_failure(describe_exception(exc))
    return pump.writer.response


@dataclass(frozen=True)
class KeepAlive:
    """How an idle stream is kept alive: a comment every `comment_s`, a protocol heartbeat event once no event
    went out for `event_s` (None: never)."""

    comment_s: float | None = DEFAULT_HEARTBEAT_S
    event_s: float | None = DEFAULT_EVENT_HEARTBEAT_S

    @property
    def tick_s(self) -> float | None:
        """How long the pump waits for an event before it sends something itself."""
        intervals = [s for s in (self.comment_s, self.event_s) if s is not None]
        return min(intervals) if intervals else None

    def event_due(self, idle_s: float) -> bool:
        """Whether a heartbeat event is due after `idle_s` without an event. Ticks come every `tick_s` and a
        timer may fire a hair early, so half a tick counts as there: 4 ticks of 15 s make the 60 s."""
        return self.event_s is not None and idle_s >= self.event_s - self.tick_s / 2


class _SsePump:
    def __init__(self, stream: RequestStream, writer: SseWriter, encoder: StreamEncoder, keep_alive: KeepAlive):
        self.stream = stream
        self.writer = writer
        self.encoder = encoder
        self.keep_alive = keep_alive
        self.last_event_at = time.monotonic()  # when the last event (not a comment) went out
        # set once Finished went out: a client hanging up after that (Codex does) is a normal end
        self.finished = False

    async def run(self) -> None:
        await self.writer.open()
        await self._send(self.encoder.start())
        await self._send_events()
        await self.writer.close()

    def abort_unfinished(self) -> None:
        if not self.finished:
            self.stream.abort()
            log.info("client disconnected; aborted %s", self.stream.request_id)

    async def report_failure(self, error: ApiError) -> None:
        try:
            await self.writer.send(self.encoder.fail(error))
            await self.writer.close()
        except CLIENT_GONE:
            pass

    async def _send_events(self) -> None:
        """Send the stream's events until `Finished`; while none arrives (a long prefill), keep the stream
        alive (`_keep_alive`).

        A write to a closed socket also notices a vanished client even without handler cancellation.
        """
        events = aiter(self.stream)
        pending: asyncio.Future | None = None
        try:
            while not self.finished:
                if pending is None:
                    pending = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({pending}, timeout=self.keep_alive.tick_s)
                if not done:
                    await self._keep_alive()
                    continue
                ready, pending = pending, None
                try:
                    event = ready.result()
                except StopAsyncIteration:
                    return
                self.finished = isinstance(event, Finished)
                await self._send(self.encoder.feed(event))
        finally:
            if pending is not None:
                pending.cancel()

    async def _keep_alive(self) -> None:
        """The encoder's heartbeat event once none went out for `event_s`, else a comment."""
        due = self.keep_alive.event_due(time.monotonic() - self.last_event_at)
        if due and await self._send(self.encoder.heartbeat()):
            return
        if self.keep_alive.comment_s is not None:
            await self.writer.send_comment("keep-alive")

    async def _send(self, payloads: list[SsePayload]) -> bool:
        """Send `payloads` (if any); whether an event went out."""
        if not payloads:
            return False
        await self.writer.send(payloads)
        self.last_event_at = time.monotonic()
        return True
