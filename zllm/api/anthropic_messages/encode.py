"""Canonical events → Anthropic Messages SSE (every frame names its event; `ping` follows `message_start`):

    event: message_start
    data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m",
           "content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":6,
           "cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":0}}}
    event: ping                 data: {"type":"ping"}
    event: content_block_start  data: {…,"index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}
    event: content_block_delta  data: {…,"index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}
    event: content_block_delta  data: {…,"index":0,"delta":{"type":"signature_delta","signature":"zllm1.…"}}
    event: content_block_stop   data: {"type":"content_block_stop","index":0}
    … index 1: {"type":"text","text":""} → text_delta …
    … index 2: {"type":"tool_use","id":"toolu_…","name":"sh","input":{}} → input_json_delta …
    event: message_delta  data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},
                                 "usage":{"output_tokens":12}}
    event: message_stop   data: {"type":"message_stop"}

Blocks open lazily in event order, one at a time, with increasing indexes: a block closes when a block of
another kind starts (a tool_use block also at its ToolCallEnd). Empty deltas open nothing.

Usage follows Anthropic: input_tokens + cache_creation_input_tokens + cache_read_input_tokens is the whole
prompt, the number count_tokens returns. `cache_read_input_tokens` is what the prefix cache restored,
`cache_creation_input_tokens` what was prefilled and handed to it to keep (the rest of the prompt whenever
the cache keeps conversations, at no extra cost), `input_tokens` what was prefilled and not kept (all of it
with the cache off). The split is known once the prefix cache has answered, before the prefill: the stream
starts with a `PromptSplit` (prompt_split.py) and message_start, sent then, carries it. message_delta carries
`output_tokens` only: clients merge its usage into message_start's field by field — Claude Code takes a
delta's field when it is above 0, the SDK's stream helper when it is present, others add them up — and an
absent field leaves the start's split in place under every one of those merges (a repeated or a re-split
one would count the prompt twice under some). A stream that ends before its split arrived (no PromptSplit)
starts from the Finished usage.

While nothing else is sent (the prompt is prefilling) the stream pump asks for a heartbeat (api/stream_pump.py) and
sends what `heartbeat()` returns: with no content block open a `message_delta` that repeats what the message
already says (`heartbeat_delta`), inside a block an empty delta of the block's kind:

    event: message_delta  data: {"type":"message_delta","delta":{"stop_reason":null,"stop_sequence":null},
                                 "usage":{"output_tokens":0}}
    event: content_block_delta  data: {…,"index":1,"delta":{"type":"text_delta","text":""}}

ABORT ends the stream without message_stop. ERROR is `event: error` with
`{"type":"error","error":{"type":"api_error"|"overloaded_error"|…,"message":…}}`.
A tool_use id is the core's call id in Anthropic's spelling (`toolu_` + its hex: api/call_ids.py). The stop
reason is the canonical finish reason mapped (the core decides "ended for tools": runtime/turn_output.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from zllm import ids
from zllm.api.anthropic_messages import wire
from zllm.api.anthropic_messages.prompt_split import PromptSplit
from zllm.api.anthropic_messages.signature import sign_thinking
from zllm.api.call_ids import ANTHROPIC, shown_call_id
from zllm.api.errors import ApiError, anthropic_error_body, finished_error
from zllm.api.sse import SseMessage
from zllm.canonical import (
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

log = logging.getLogger("zllm.api")


def frame(data: dict) -> SseMessage:
    return SseMessage(data, event=data["type"])


def usage_body(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def delta_usage_body(usage: Usage) -> dict:
    """message_delta's usage: what changed since message_start, the output (see the module docstring)."""
    return {"output_tokens": usage.completion_tokens}


def heartbeat_delta() -> dict:
    """A `message_delta` for the stream watchdog of Claude Code, which counts every event but `ping` (comments
    never reach it) and gives up after 300 s without one: a cold prefill can take longer.

    It must change nothing a client accumulates. The Anthropic SDKs copy `stop_reason` and `stop_sequence`
    (null until the last delta) and `usage.output_tokens` (required: the TS SDK reads it unconditionally) into
    the message, and the input and cache fields only when present; Claude Code keeps each input or cache field
    of message_start unless a delta's is above 0, and takes output_tokens when present. So the heartbeat
    carries output_tokens 0, as message_start did, and no input or cache field (a value there could only
    repeat or contradict message_start's split). The last message_delta then sets the real values.

    One cost remains: Claude Code adds the merged usage of every message_delta to its session totals (`/cost`,
    `modelUsage`), so each heartbeat counts the prompt once more there; the pump sends them rarely (once a
    minute, api/stream_pump.py) and `zllm claude` raises the watchdog so that they are rarely needed."""
    return {"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
            "usage": {"output_tokens": 0}}


# an empty delta of each block kind: a heartbeat inside an open block (appending "" changes nothing)
_EMPTY_DELTAS = {
    wire.TEXT: {"type": "text_delta", "text": ""},
    wire.THINKING: {"type": "thinking_delta", "thinking": ""},
    wire.TOOL_USE: {"type": "input_json_delta", "partial_json": ""},
}


def new_message_id() -> str:
    return ids.new_id("msg")


@dataclass
class _OpenBlock:
    index: int
    kind: str                      # wire.TEXT | wire.THINKING | wire.TOOL_USE
    tool_index: int | None = None  # the canonical call index of a tool_use block
    # thinking text (signed at close) or the tool arguments streamed so far
    text: list[str] = field(default_factory=list)


class MessagesStreamEncoder:
    """One streaming request's state machine: canonical events in, `SseMessage` frames out."""

    def __init__(self, *, message_id: str, model: str, prompt_tokens: int, extra: dict | None = None,
                 context_management: dict | None = None, compaction: str | None = None):
        """`extra`: more fields of the message object, as `message_start` (and so the non-streaming answer)
        carries them: `{"diagnostics": …}` (api/cache_diagnostics.py). `prompt_tokens`: the whole prompt,
        reported as input only by a stream whose first event is not its PromptSplit. `context_management`:
        the applied edits, which Anthropic sends on the last `message_delta` (context_management.py).
        `compaction`: the summary a compaction wrote, sent whole as block 0 before what the model writes."""
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.extra = extra or {}
        self.context_management = context_management
        self.compaction = compaction
        self._open: _OpenBlock | None = None
        self._next_index = 0 if compaction is None else 1
        self._started = False  # message_start went out
        self._ended = False    # the last message_delta (or an error) went out: nothing may follow

    def start(self) -> list[SseMessage]:
        return []  # message_start waits for the prompt's split (the PromptSplit event)

    def _message_start(self, prompt: Usage) -> list[SseMessage]:
        self._started = True
        message = {
            "id": self.message_id, "type": wire.MESSAGE, "role": wire.ASSISTANT, "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": usage_body(replace(prompt, completion_tokens=0)),
            **self.extra,
        }
        return [frame({"type": "message_start", "message": message}), frame({"type": "ping"}),
                *self._compaction_block()]

    def _compaction_block(self) -> list[SseMessage]:
        """The summary as Anthropic streams a compaction block: one `compaction_delta` with all of it."""
        if self.compaction is None:
            return []
        return [frame({"type": "content_block_start", "index": 0,
                       "content_block": {"type": wire.COMPACTION, "content": None}}),
                self._delta_frame({"type": "compaction_delta", "content": self.compaction}, 0),
                frame({"type": "content_block_stop", "index": 0})]

    def paused(self, usage: Usage) -> list[SseMessage]:
        """The whole answer of a compaction that pauses after the summary (`pause_after_compaction`): the
        compaction block alone, stop reason "compaction"; `usage` is the summary's."""
        self._ended = True
        last_delta = {"type": "message_delta", "delta": {"stop_reason": wire.COMPACTION, "stop_sequence": None},
                      "usage": delta_usage_body(usage)}
        if self.context_management is not None:
            last_delta["context_management"] = self.context_management
        return [*self._message_start(replace(usage, completion_tokens=0)), frame(last_delta),
                frame({"type": "message_stop"})]

    def heartbeat(self) -> list[SseMessage]:
        """What the pump sends while no event comes (see the module docstring); [] before message_start and
        after the end, where no event may go."""
        if not self._started or self._ended:
            return []
        if self._open is None:
            return [frame(heartbeat_delta())]
        return [self._delta_frame(dict(_EMPTY_DELTAS[self._open.kind]))]

    def feed(self, event: Event | PromptSplit) -> list[SseMessage]:
        if isinstance(event, PromptSplit):
            return [] if self._started else self._message_start(event.usage)
        if not self._started:
            usage = event.usage if isinstance(event, Finished) else Usage(self.prompt_tokens, 0)
            return [*self._message_start(usage), *self._feed(event)]
        return self._feed(event)

    def _feed(self, event: Event) -> list[SseMessage]:
        match event:
            case TextDelta(text=text):
                return self._delta(wire.TEXT, {"type": "text_delta", "text": text}, text)
            case ReasoningDelta(text=text):
                return self._delta(wire.THINKING, {"type": "thinking_delta", "thinking": text}, text)
            case ToolCallStart():
                return self._tool_use_start(event)
            case ToolCallArgsDelta(index=index, text=text):
                return self._tool_arguments(index, text)
            case ToolCallEnd(index=index, arguments=arguments):
                return self._tool_use_end(index, arguments)
            case Finished():
                return self._finish(event)
        raise TypeError(f"not a canonical event: {event!r}")

    def fail(self, error: ApiError) -> list[SseMessage]:
        return [frame(anthropic_error_body(error))]

    # blocks -------------------------------------------------------------------------------------------------

    def _delta(self, kind: str, delta: dict, text: str) -> list[SseMessage]:
        if not text:
            return []
        frames = [] if self._open and self._open.kind == kind else self._switch_to(kind, {"type": kind, kind: ""})
        assert self._open is not None
        self._open.text.append(text)
        return [*frames, self._delta_frame(delta)]

    def _switch_to(self, kind: str, content_block: dict, tool_index: int | None = None) -> list[SseMessage]:
        frames = self._close()
        if kind == wire.THINKING:
            content_block["signature"] = ""
        self._open = _OpenBlock(self._next_index, kind, tool_index)
        self._next_index += 1
        return [*frames, frame({"type": "content_block_start", "index": self._open.index,
                                "content_block": content_block})]

    def _close(self) -> list[SseMessage]:
        block, self._open = self._open, None
        if block is None:
            return []
        frames = []
        if block.kind == wire.THINKING:
            signature = sign_thinking(self.model, "".join(block.text))
            frames.append(self._delta_frame({"type": "signature_delta", "signature": signature}, block.index))
        return [*frames, frame({"type": "content_block_stop", "index": block.index})]

    def _delta_frame(self, delta: dict, index: int | None = None) -> SseMessage:
        index = self._open.index if index is None else index  # type: ignore[union-attr]
        return frame({"type": "content_block_delta", "index": index, "delta": delta})

    # tool_use ------------------------------------------------------------------------------------------------

    def _tool_use_start(self, event: ToolCallStart) -> list[SseMessage]:
        block = {"type": wire.TOOL_USE, "id": shown_call_id(event.id, ANTHROPIC), "name": event.name, "input": {}}
        return self._switch_to(wire.TOOL_USE, block, tool_index=event.index)

    def _open_tool(self, index: int) -> _OpenBlock | None:
        block = self._open
        if block is None or block.kind != wire.TOOL_USE or block.tool_index != index:
            # tool_use blocks cannot be reopened; dialects emit calls one after another, so this is a bug
            log.warning("tool call %d is not the open content block; dropping its arguments", index)
            return None
        return block

    def _tool_arguments(self, index: int, text: str) -> list[SseMessage]:
        block = self._open_tool(index)
        if block is None or not text:
            return []
        block.text.append(text)
        return [self._delta_frame({"type": "input_json_delta", "partial_json": text})]

    def _tool_use_end(self, index: int, arguments: str) -> list[SseMessage]:
        # A dialect that only knows the arguments at the end sends them here; stream what is still missing.
        block = self._open_tool(index)
        if block is None:
            return []
        streamed = "".join(block.text)
        frames = []
        if arguments.startswith(streamed):
            frames = self._tool_arguments(index, arguments[len(streamed):])
        else:
            log.warning("tool call %d: final arguments do not extend the streamed ones; keeping the stream", index)
        return [*frames, *self._close()]

    # end -----------------------------------------------------------------------------------------------------

    def _finish(self, finished: Finished) -> list[SseMessage]:
        self._ended = True
        if finished.reason is FinishReason.ABORT:
            return []
        if finished.reason is FinishReason.ERROR:
            return self.fail(finished_error(finished))
        delta = {"stop_reason": wire.STOP_REASONS[finished.reason],
                 "stop_sequence": finished.stop_sequence if finished.reason is FinishReason.STOP_SEQUENCE else None}
        last_delta = {"type": "message_delta", "delta": delta, "usage": delta_usage_body(finished.usage)}
        if self.context_management is not None:
            last_delta["context_management"] = self.context_management
        return [*self._close(), frame(last_delta), frame({"type": "message_stop"})]
