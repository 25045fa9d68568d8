"""The one loop that runs a request's events out through an API's encoder: SSE (api/sse.py), Ollama's NDJSON
(api/ollama/ndjson.py), the Responses WebSocket (openai_responses/websocket.py) and every non-streaming answer
(api/collect.py) differ only in where the encoder's frames go (a `FrameSink`) and how a failure ends.

    pump = StreamPump(stream, encoder, sink, keep_alive)
    await pump.serve()               # to a client: a hang-up ends it quietly, a failure is reported in-stream
    finished = await pump.collect()  # no client stream: a hang-up or failure aborts and propagates

The encoder's `start()` frames go first, then `feed(event)`'s for each event up to and including `Finished`.
A client that goes away (the handler is cancelled, or a write finds the socket closed) aborts the engine
request, unless `Finished` was already seen: a hang-up after it (Codex hangs up right after the last event)
is a normal end.

While no event comes (a long prefill, a wait in the queue) the pump keeps the stream alive two ways: a filler
every `comment_s` (SSE's comment: idle-timeout proxies, and a write that notices a vanished client), and once
a minute (`event_s`) the encoder's `heartbeat()` instead: a real event of the protocol that changes nothing a
client accumulates. Clients' stream watchdogs count only events, never comments: Claude Code aborts a stream
after 300 s without one (it ignores `ping` too; the floor cannot be lowered) and Codex after its
`stream_idle_timeout_ms` (300 s by default), so a cold prefill longer than that would otherwise be retried from
the start, again and again. An encoder with nothing harmless to send at that point returns [] and the filler
goes out instead. NDJSON has neither (`KeepAlive.NONE`): it has no comment line, and Ollama's clients wait
without an idle timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

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


class StreamEncoder(Protocol):
    """A protocol's streaming state machine: canonical events in, the API's frames out."""

    def start(self) -> list: ...

    def feed(self, event: Event) -> list: ...

    def fail(self, error: ApiError) -> list:
        """Frames that report `error` to the client mid-stream."""
        ...

    def heartbeat(self) -> list:
        """An event that clients' idle watchdogs count and that changes nothing they accumulate (the
        answer's text, calls, stop reason or usage), valid at this point of the stream; [] when there is none."""
        ...


class FrameSink:
    """Where a pump's frames go. Only `send` is required; the rest do nothing unless a transport needs them."""

    async def open(self) -> None:
        pass

    async def send(self, frames: list) -> None:
        raise NotImplementedError

    async def send_filler(self) -> None:
        """Keep an idle stream alive without an event (SSE's comment)."""

    async def close(self) -> None:
        pass


class HttpStreamSink(FrameSink):
    """Frames written to a streamed HTTP response: `encode` makes one frame's bytes (SSE, NDJSON)."""

    def __init__(self, request: web.Request, response: web.StreamResponse):
        self.request = request
        self.response = response

    def encode(self, frame) -> bytes:
        raise NotImplementedError

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, frames: Iterable) -> None:
        data = b"".join(self.encode(frame) for frame in frames)
        if data:
            await self.response.write(data)

    async def close(self) -> None:
        try:
            await self.response.write_eof()
        except CLIENT_GONE:
            pass  # some clients (Codex) hang up right after the last frame, before the chunked terminator


@dataclass(frozen=True)
class KeepAlive:
    """How an idle stream is kept alive: the sink's filler every `comment_s`, a protocol heartbeat event once no
    event went out for `event_s` (None: never)."""

    comment_s: float | None = DEFAULT_HEARTBEAT_S
    event_s: float | None = DEFAULT_EVENT_HEARTBEAT_S
    NONE: ClassVar[KeepAlive]

    @property
    def tick_s(self) -> float | None:
        """How long the pump waits for an event before it sends something itself."""
        intervals = [s for s in (self.comment_s, self.event_s) if s is not None]
        return min(intervals) if intervals else None

    def event_due(self, idle_s: float) -> bool:
        """Whether a heartbeat event is due after `idle_s` without an event. Ticks come every `tick_s` and a
        timer may fire a hair early, so half a tick counts as there: 4 ticks of 15 s make the 60 s."""
        return self.event_s is not None and idle_s >= self.event_s - self.tick_s / 2


KeepAlive.NONE = KeepAlive(comment_s=None, event_s=None)


class StreamPump:
    """`on_finished`: called as `Finished` arrives, before its frames go out (the WebSocket stops offering the
    response to `response.cancel` there)."""

    def __init__(self, stream: RequestStream, encoder: StreamEncoder, sink: FrameSink,
                 keep_alive: KeepAlive = KeepAlive.NONE, *, on_finished: Callable[[], Any] | None = None):
        self.stream = stream
        self.encoder = encoder
        self.sink = sink
        self.keep_alive = keep_alive
        self.on_finished = on_finished
        self.finished: Finished | None = None
        self.last_event_at = time.monotonic()  # when the last event (not a filler) went out

    async def serve(self) -> None:
        """Run the request out to a client: a hang-up ends it quietly (a normal end for streaming clients, not
        an error to log), a failure is reported in-stream, never as a traceback."""
        try:
            await self._run()
        except asyncio.CancelledError:  # handler cancellation: aiohttp cancels it when the connection drops
            self._abort_unfinished(hang_up=True)
            raise
        except CLIENT_GONE:  # a write found the socket closed (also without handler cancellation)
            self._abort_unfinished(hang_up=True)
        except Exception as exc:  # a bug in the pump or encoder
            self._abort_unfinished(hang_up=False)
            await self._report_failure(describe_exception(exc))

    async def collect(self) -> Finished | None:
        """Run the request to its end with no client stream; `Finished` (None if the stream ended without
        one). A hang-up or a failure before `Finished` aborts the engine request and propagates."""
        try:
            await self._run()
        except asyncio.CancelledError:
            self._abort_unfinished(hang_up=True)
            raise
        except BaseException:
            self._abort_unfinished(hang_up=False)
            raise
        return self.finished

    async def _run(self) -> None:
        await self.sink.open()
        await self._send(self.encoder.start())
        await self._send_events()
        await self.sink.close()

    def _abort_unfinished(self, *, hang_up: bool) -> None:
        if self.finished is None:
            self.stream.abort()
            if hang_up:
                log.info("client disconnected; aborted %s", self.stream.request_id)

    async def _report_failure(self, error: ApiError) -> None:
        try:
            await self.sink.send(self.encoder.fail(error))
            await self.sink.close()
        except CLIENT_GONE:
            pass

    async def _send_events(self) -> None:
        """Send the stream's events until `Finished`."""
        events = aiter(self.stream)
        while self.finished is None:
            try:
                event = await self._next(events)
            except StopAsyncIteration:
                return
            if isinstance(event, Finished):
                self.finished = event
                if self.on_finished is not None:
                    self.on_finished()
            await self._send(self.encoder.feed(event))

    async def _next(self, events: AsyncIterator) -> Any:
        """The stream's next event; while none arrives (a long prefill), keep the stream alive (`_keep_alive`)."""
        tick_s = self.keep_alive.tick_s
        if tick_s is None:
            return await anext(events)
        pending = asyncio.ensure_future(anext(events))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=tick_s)
                if done:
                    return pending.result()
                await self._keep_alive()
        finally:
            pending.cancel()  # a no-op once it is done

    async def _keep_alive(self) -> None:
        """The encoder's heartbeat event once none went out for `event_s`, else the sink's filler."""
        due = self.keep_alive.event_due(time.monotonic() - self.last_event_at)
        if due and await self._send(self.encoder.heartbeat()):
            return
        if self.keep_alive.comment_s is not None:
            await self.sink.send_filler()

    async def _send(self, frames: list) -> bool:
        """Send `frames` (if any); whether an event went out."""
        if not frames:
            return False
        await self.sink.send(frames)
        self.last_event_at = time.monotonic()
        return True
