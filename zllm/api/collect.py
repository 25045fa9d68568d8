"""Run a request's events to their end for a non-streaming answer, aborting it if the client goes first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from zllm.api.errors import ReportedError, finished_error
from zllm.canonical import (
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    RequestStream,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.errors import Overloaded

log = logging.getLogger("zllm.api")


async def run_to_finish(stream: RequestStream, feed: Callable[[Event], None]) -> Finished | None:
    """Feed every event to `feed` up to and including `Finished`, which is returned (None if the stream ended
    without one). A hang-up (handler cancellation) or a failure before `Finished` aborts the engine request."""
    try:
        async for event in stream:
            feed(event)
            if isinstance(event, Finished):
                return event  # done: a hang-up from here on must not abort a finished request
    except asyncio.CancelledError:
        stream.abort()
        log.info("client disconnected; aborted %s", stream.request_id)
        raise
    except Exception:
        stream.abort()
        raise
    return None


def raise_unless_completed(finished: Finished | None) -> Finished:
    """A non-streaming answer exists only for a request that ran to its end: ABORT (or no Finished at all)
    becomes a retryable `Overloaded`, ERROR re-raises the engine's error at the edge."""
    if finished is None or finished.reason is FinishReason.ABORT:
        raise Overloaded("the request was aborted before it finished; retry it")
    if finished.reason is FinishReason.ERROR:
        error = finished_error(finished)
        raise ReportedError(error.code, error.message)
    return finished


class CollectedAnswer:
    """A non-streaming answer's parts gathered from its events, for an API's builder to shape: the text, the
    reasoning, the tool calls (ToolCallEnd's arguments replace the streamed deltas) and the Finished event."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index → [id, name, arguments]
        self.finished: Finished | None = None

    def feed(self, event: Event) -> None:
        match event:
            case TextDelta(text=text):
                self._text.append(text)
            case ReasoningDelta(text=text):
                self._reasoning.append(text)
            case ToolCallStart(index=index, id=call_id, name=name):
                self._calls[index] = [call_id, name, ""]
            case ToolCallArgsDelta(index=index, text=text):
                self._calls.setdefault(index, ["", "", ""])[2] += text
            case ToolCallEnd(index=index, arguments=arguments):
                self._calls.setdefault(index, ["", "", ""])[2] = arguments
            case Finished():
                self.finished = event

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def has_reasoning(self) -> bool:
        return bool(self._reasoning)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def tool_calls(self) -> list[tuple[int, str, str, str]]:
        """(index, id, name, arguments) of each call, in index order."""
        return [(index, call_id, name, arguments) for index, (call_id, name, arguments) in sorted(self._calls.items())]
