"""Canonical events → Responses stream events. SSE (`event: <type>` + `data: <json>`) and WebSocket (one
JSON text frame each) carry the same objects; every one has a `sequence_number`, counting from 0:

    response.created {response: {…, status: "in_progress", output: []}}
    response.in_progress
    [ReasoningDelta…]  response.output_item.added {output_index, item: {type: "reasoning", id: "rs_…", summary: []}}
                       response.reasoning_summary_part.added → response.reasoning_summary_text.delta (×n)
                       → .reasoning_summary_text.done → .reasoning_summary_part.done → response.output_item.done
    [TextDelta…]       response.output_item.added {item: {type: "message", id: "msg_…", role: "assistant", …}}
                       response.content_part.added → response.output_text.delta (×n) → response.output_text.done
                       → response.content_part.done → response.output_item.done
    [ToolCall…]        function:  response.output_item.added {item: {type: "function_call", id: "fc_…",
                                  call_id: "call_…", name, arguments: ""}} → response.function_call_arguments.delta
                                  (×n) → response.function_call_arguments.done → response.output_item.done
                       custom:    … {type: "custom_tool_call", id: "ctc_…", call_id, name, input: ""} →
                                  response.custom_tool_call_input.delta → .done → response.output_item.done
    Finished           response.completed | response.incomplete (LENGTH) | response.failed (ERROR);
                       ABORT after `cancel()`: response.incomplete with status "cancelled" (see wire.py);
                       any other ABORT: nothing (a disconnect or shutdown: nobody is listening)

While nothing else is sent (a long prefill) the stream pump sends `heartbeat()` once a minute (api/stream_pump.py): the
Responses API has no heartbeat event, so `response.in_progress` repeats (the snapshot as `response.created`
showed it, the next sequence_number). Codex's stream watchdog (`stream_idle_timeout_ms`, 300 s by default)
counts any event and ignores that type; the OpenAI SDK's stream state keeps its snapshot.

A custom tool's input arrives as JSON `{"input": "…"}` text; it is sent as one delta once the call ends
(streaming it would need an incremental JSON-string decoder; no client here shows partial input).
Item ids are minted per response (`mint`), never derived from names; a call's `call_id` is the core's id for
the call (api/call_ids.py), so the trace, the stream and the next turn's history name the call alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from zllm import ids
from zllm.api.call_ids import OPENAI, shown_call_id
from zllm.api.errors import ApiError, finished_error
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.items import encode_reasoning
from zllm.api.openai_responses.response_object import (
    EMPTY_USAGE,
    failed_error_body,
    usage_body,
)
from zllm.api.openai_responses.tools import ToolSet, WireTool, custom_input
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


@dataclass
class _OpenItem:
    output_index: int
    item: dict                                   # as `output_item.added` showed it
    pieces: list[str] = field(default_factory=list)
    tool: WireTool | None = None                 # for calls

    @property
    def id(self) -> str:
        return self.item["id"]

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ResponseEventEncoder:
    """One response's state machine. `on_finish(response)` runs before the terminal event is handed out, so
    the response is recorded before a client that hangs up right after `response.completed` can cancel us."""

    def __init__(self, response: dict, tools: ToolSet, *, encrypted_reasoning: bool = False,
                 on_finish: Callable[[dict], None] | None = None,
                 mint: Callable[[str], str] = ids.new_id, clock: Callable[[], float] = time.time):
        self.response = response
        self.tools = tools
        self.encrypted_reasoning = encrypted_reasoning
        self.on_finish = on_finish
        self._mint = mint
        self._clock = clock
        self._sequence = 0
        self._output: list[dict] = []            # items by output index; replaced by their final form when done
        self._message: _OpenItem | None = None
        self._reasoning: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}   # canonical tool call index → open call
        self._reasoning_deltas = 0
        self.cancelled = False
        self.final: dict | None = None           # the response as its terminal event carried it

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> list[dict]:
        return [self._emit("response.created", response=self._snapshot()),
                self._emit("response.in_progress", response=self._snapshot())]

    def heartbeat(self) -> list[dict]:
        """`response.in_progress` again, until the terminal event (see the module docstring)."""
        return [] if self.final is not None else [self._emit("response.in_progress", response=self._snapshot())]

    def prewarm(self) -> list[dict]:
        """`generate: false`: created, then completed with no output (Codex then chains to it)."""
        created = self._emit("response.created", response=self._snapshot())
        return [created, self._terminal(wire.STATUS_COMPLETED, EMPTY_USAGE)]

    def feed(self, event: Event) -> list[dict]:
        match event:
            case TextDelta(text=text):
                return self._text(text) if text else []
            case ReasoningDelta(text=text):
                return self._reasoning_text(text) if text else []
            case ToolCallStart():
                return self._call_start(event)
            case ToolCallArgsDelta(index=index, text=text):
                return self._call_arguments(index, text) if text else []
            case ToolCallEnd(index=index, arguments=arguments):
                return self._call_end(index, arguments)
            case Finished():
                return self._finish(event)
        raise TypeError(f"not a canonical event: {event!r}")

    def cancel(self) -> None:
        """`POST /v1/responses/{id}/cancel` stops this response: the ABORT its stream ends with is a cancel."""
        self.cancelled = True

    def cancelled_snapshot(self) -> dict:
        """The response as a cancel sees it before its stream has ended (output so far, no usage yet)."""
        return {**self._snapshot(), "status": wire.STATUS_CANCELLED, "output": list(self._output)}

    def fail(self, error: ApiError) -> list[dict]:
        failed = {**self._snapshot(), "status": wire.STATUS_FAILED, "error": failed_error_body(error)}
        return [self._emit("response.failed", response=failed)]

    # ---------------------------------------------------------------- text and reasoning

    def _text(self, text: str) -> list[dict]:
        events = self._close_reasoning(wire.STATUS_COMPLETED)
        if self._message is None:
            self._message = self._open({"type": wire.MESSAGE, "id": self._mint(wire.MESSAGE_ID),
                                        "status": wire.STATUS_IN_PROGRESS, "role": "assistant", "content": []})
            events += [self._added(self._message),
                       self._emit("response.content_part.added", **self._where(self._message), content_index=0,
                                  part=_output_text(""))]
        self._message.pieces.append(text)
        return [*events, self._emit("response.output_text.delta", **self._where(self._message), content_index=0,
                                    delta=text, logprobs=[])]

    def _reasoning_text(self, text: str) -> list[dict]:
        events = self._close_message(wire.STATUS_COMPLETED)
        if self._reasoning is None:
            self._reasoning = self._open({"type": wire.REASONING, "id": self._mint(wire.REASONING_ID), "summary": []})
            events += [self._added(self._reasoning),
                       self._emit("response.reasoning_summary_part.added", **self._where(self._reasoning),
                                  summary_index=0, part=_summary_text(""))]
        self._reasoning.pieces.append(text)
        self._reasoning_deltas += 1
        return [*events, self._emit("response.reasoning_summary_text.delta", **self._where(self._reasoning),
                                    summary_index=0, delta=text)]

    def _close_message(self, status: str) -> list[dict]:
        item, self._message = self._message, None
        if item is None:
            return []
        part = _output_text(item.text)
        where = self._where(item)
        return [self._emit("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                self._emit("response.content_part.done", **where, content_index=0, part=part),
                self._done(item, {**item.item, "status": status, "content": [part]})]

    def _close_reasoning(self, status: str) -> list[dict]:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return []
        part = _summary_text(item.text)
        final = {**item.item, "summary": [part]}
        if self.encrypted_reasoning:
            final["encrypted_content"] = encode_reasoning(item.text)
        if status != wire.STATUS_COMPLETED:
            final["status"] = status
        where = self._where(item)
        return [self._emit("response.reasoning_summary_text.done", **where, summary_index=0, text=item.text),
                self._emit("response.reasoning_summary_part.done", **where, summary_index=0, part=part),
                self._done(item, final)]

    # ---------------------------------------------------------------- tool calls

    def _call_start(self, event: ToolCallStart) -> list[dict]:
        events = self._close_reasoning(wire.STATUS_COMPLETED) + self._close_message(wire.STATUS_COMPLETED)
        tool = self.tools.wire_tool(event.name)
        custom = tool.kind == "custom"
        item = {"type": wire.CUSTOM_TOOL_CALL if custom else wire.FUNCTION_CALL,
                "id": self._mint(wire.CUSTOM_TOOL_CALL_ID if custom else wire.FUNCTION_CALL_ID),
                "status": wire.STATUS_IN_PROGRESS, "call_id": shown_call_id(event.id, OPENAI), "name": tool.name,
                **({"input": ""} if custom else {"arguments": ""})}
        if tool.namespace:
            item["namespace"] = tool.namespace
        call = self._calls[event.index] = self._open(item, tool)
        return [*events, self._added(call)]

    def _call_arguments(self, index: int, text: str) -> list[dict]:
        call = self._calls.get(index)
        if call is None:
            return []  # arguments for a call that never started: nothing to attach them to
        call.pieces.append(text)
        if call.tool.kind == "custom":
            return []  # sent whole at the end (see the module docstring)
        return [self._emit("response.function_call_arguments.delta", **self._where(call), delta=text)]

    def _call_end(self, index: int, arguments: str) -> list[dict]:
        call = self._calls.pop(index, None)
        if call is None:
            return []
        streamed = call.text
        events = []
        if call.tool.kind == "function" and arguments.startswith(streamed) and arguments != streamed:
            events = self._call_arguments_rest(call, arguments[len(streamed):])
        call.pieces = [arguments]
        return events + self._close_call(call, wire.STATUS_COMPLETED)

    def _call_arguments_rest(self, call: _OpenItem, rest: str) -> list[dict]:
        # a dialect that knows the arguments only at the end sends them here
        return [self._emit("response.function_call_arguments.delta", **self._where(call), delta=rest)]

    def _close_call(self, call: _OpenItem, status: str) -> list[dict]:
        where = self._where(call)
        if call.tool.kind == "custom":
            text = custom_input(call.text)
            events = [self._emit("response.custom_tool_call_input.delta", **where, delta=text)] if text else []
            events.append(self._emit("response.custom_tool_call_input.done", **where, input=text))
            return [*events, self._done(call, {**call.item, "status": status, "input": text})]
        return [self._emit("response.function_call_arguments.done", **where, arguments=call.text),
                self._done(call, {**call.item, "status": status, "arguments": call.text})]

    # ---------------------------------------------------------------- the end

    def _finish(self, finished: Finished) -> list[dict]:
        if finished.reason is FinishReason.ABORT and not self.cancelled:
            return []
        status = wire.FINISH_STATUS[finished.reason]
        item_status = wire.STATUS_COMPLETED if status == wire.STATUS_COMPLETED else wire.STATUS_INCOMPLETE
        events = self._close_reasoning(item_status) + self._close_message(item_status)
        for index in sorted(self._calls):
            events += self._close_call(self._calls.pop(index), item_status)
        error = finished_error(finished) if finished.reason is FinishReason.ERROR else None
        return [*events, self._terminal(status, finished.usage, error, finished.reason)]

    def _terminal(self, status: str, usage: Usage, error: ApiError | None = None,
                  reason: FinishReason = FinishReason.LENGTH) -> dict:
        response = {**self._snapshot(), "status": status, "output": list(self._output),
                    "usage": usage_body(usage, reasoning_tokens=self._reasoning_tokens(usage))}
        if status == wire.STATUS_COMPLETED:
            response["completed_at"] = int(self._clock())
        if status == wire.STATUS_INCOMPLETE:
            response["incomplete_details"] = {
                "reason": wire.INCOMPLETE_REASONS.get(reason, wire.INCOMPLETE_MAX_OUTPUT_TOKENS)}
        if error is not None:
            response["error"] = failed_error_body(error)
        self.final = response
        if self.on_finish is not None:
            self.on_finish(response)
        return self._emit(wire.TERMINAL_EVENTS[status], response=response)

    def _reasoning_tokens(self, usage: Usage) -> int:
        # canonical Usage does not count reasoning tokens; the runtime sends about one delta per token, so
        # the delta count is the estimate (0 is exact when there was no reasoning)
        return min(self._reasoning_deltas, usage.completion_tokens)

    # ---------------------------------------------------------------- helpers

    def _open(self, item: dict, tool: WireTool | None = None) -> _OpenItem:
        self._output.append(item)
        return _OpenItem(len(self._output) - 1, item, tool=tool)

    def _added(self, item: _OpenItem) -> dict:
        return self._emit("response.output_item.added", output_index=item.output_index, item=item.item)

    def _done(self, item: _OpenItem, final: dict) -> dict:
        self._output[item.output_index] = final
        return self._emit("response.output_item.done", output_index=item.output_index, item=final)

    @staticmethod
    def _where(item: _OpenItem) -> dict:
        return {"item_id": item.id, "output_index": item.output_index}

    def _snapshot(self) -> dict:
        return {**self.response, "output": []}

    def _emit(self, event_type: str, **fields) -> dict:
        event = {"type": event_type, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return event


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _summary_text(text: str) -> dict:
    return {"type": "summary_text", "text": text}
