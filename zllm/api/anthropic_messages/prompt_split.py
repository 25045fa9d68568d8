"""A request stream whose first item is its prompt's cache split, so `message_start` can report it.

    stream = split_first(await engine.submit(request))   # still a RequestStream: abort(), request_id, ...
    async for item in stream: ...                         # PromptSplit(usage), then the canonical events

The split (how much of the prompt the prefix cache restored, how much will be prefilled and kept) is known
only once the engine has looked the prompt up, which may be after a wait in line and an SSD read. Anthropic
clients take the input split from `message_start` (message_delta only adds the output: encode.py), so the
encoder sends `message_start` when this item arrives. Items go through the same pump as the events, so while
the request waits the stream keeps getting its keep-alives, and a client that leaves aborts the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from zllm.canonical import Event, RequestStream, Usage


@dataclass(frozen=True)
class PromptSplit:
    """Not a canonical event: the API layer's marker for RequestStream.prompt_usage() (completion 0)."""

    usage: Usage


class SplitFirst:
    """`stream` with its PromptSplit in front; everything else is the stream's own."""

    def __init__(self, stream: RequestStream):
        self._stream = stream
        self.request_id = stream.request_id
        self.prompt_tokens = stream.prompt_tokens

    def abort(self) -> None:
        self._stream.abort()

    async def prompt_usage(self) -> Usage:
        return await self._stream.prompt_usage()

    async def __aiter__(self) -> AsyncIterator[Event | PromptSplit]:
        events = aiter(self._stream)
        try:
            yield PromptSplit(await self._stream.prompt_usage())
            async for event in events:
                yield event
        finally:
            await events.aclose()  # a consumer that stops early aborts the request, as the stream's own does


def split_first(stream: RequestStream) -> SplitFirst:
    return SplitFirst(stream)
