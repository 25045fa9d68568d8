"""Non-streaming answers: a request's events run to their end (aborting it if the client goes first) through
the API's stream encoder, whose frames are folded into the one answer object (`StreamedAnswer`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from zllm.api.errors import ApiError, ReportedError, finished_error
from zllm.api.stream_pump import FrameSink, StreamEncoder, StreamPump
from zllm.canonical import Event, Finished, FinishReason, RequestStream
from zllm.errors import Overloaded


async def run_to_finish(stream: RequestStream, feed: Callable[[Event], None]) -> Finished | None:
    """Feed every event to `feed` up to and including `Finished`, which is returned (None if the stream ended
    without one). A hang-up (handler cancellation) or a failure before `Finished` aborts the engine request."""
    return await StreamPump(stream, _Feed(feed), _NOWHERE).collect()


class _Feed:
    """`feed` as an encoder with no frames: the pump hands it each event."""

    def __init__(self, feed: Callable[[Event], None]):
        self.feed_event = feed

    def start(self) -> list:
        return []

    def feed(self, event: Event) -> list:
        self.feed_event(event)
        return []

    def fail(self, error: ApiError) -> list:
        return []

    def heartbeat(self) -> list:
        return []


class _Nowhere(FrameSink):
    async def send(self, frames: list) -> None:
        pass  # _Feed makes none


_NOWHERE = _Nowhere()


def raise_unless_completed(finished: Finished | None) -> Finished:
    """A non-streaming answer exists only for a request that ran to its end: ABORT (or no Finished at all)
    becomes a retryable `Overloaded`, ERROR re-raises the engine's error at the edge."""
    if finished is None or finished.reason is FinishReason.ABORT:
        raise Overloaded("the request was aborted before it finished; retry it")
    if finished.reason is FinishReason.ERROR:
        error = finished_error(finished)
        raise ReportedError(error.code, error.message)
    return finished


class Fold(Protocol):
    """Folds one API's stream frames, in order, into its non-streaming answer object."""

    def apply(self, frame) -> None: ...

    def result(self) -> dict: ...


class StreamedAnswer:
    """The one way every API builds a non-streaming answer: its stream encoder run to the end and the frames
    folded into one object (what the API's own SDK does to a stream), so a streamed and a non-streamed
    answer to the same events always agree (text, calls and their ids, finish reason, usage). Chat, Ollama
    and Anthropic fold into their answer object; Responses keeps the terminal event's response."""

    def __init__(self, encoder: StreamEncoder, fold: Fold):
        self.encoder = encoder
        self.fold = fold
        self.finished: Finished | None = None
        self._apply(encoder.start())

    def feed(self, event: Event) -> None:
        if isinstance(event, Finished):
            self.finished = event
        self._apply(self.encoder.feed(event))

    def result(self) -> dict:
        """The answer; raises the engine's error for ERROR, `Overloaded` (retryable) for ABORT."""
        raise_unless_completed(self.finished)
        return self.fold.result()

    def _apply(self, frames: list) -> None:
        for frame in frames:
            self.fold.apply(frame)
