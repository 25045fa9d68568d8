"""Run a request's events to their end for a non-streaming answer, aborting it if the client goes first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from zllm.canonical import Event, Finished, RequestStream

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
