"""Canonical events → Ollama NDJSON chunks (folded into one object for `stream: false`: reply.py).

/api/chat, streaming (one JSON object per line):

    {"model":"m","created_at":"2026-12-01T22:00:00.000000Z","message":{"role":"assistant","content":"Hel"},"done":false}
    {"model":"m","created_at":"…","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}
    {"model":"m","created_at":"…","message":{"role":"assistant","content":"","tool_calls":[{"id":"call_1",
        "function":{"index":0,"name":"sh","arguments":{"cmd":"ls"}}}]},"done":false}
    {"model":"m","created_at":"…","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",
     "total_duration":5043500667,"load_duration":0,"prompt_eval_count":26,"prompt_eval_duration":325953000,
     "eval_count":290,"eval_duration":4709213000,"zllm":{"cached_tokens":24}}

/api/generate puts the text in `"response"` (and reasoning in `"thinking"`) instead of `"message"`.
Durations are nanoseconds, measured at the edge: prompt evaluation runs from the request's arrival to its
first event, generation from there to the end; `load_duration` is 0 because the model is always resident.
`zllm.cached_tokens` (prompt tokens restored from the prefix cache) is an extension clients ignore.
Tool calls go out whole, when their arguments are complete, as Ollama sends them. An engine failure mid-stream
is a last line `{"error": "..."}` (which the ollama client raises); an aborted stream just ends.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from zllm.api.call_ids import OPENAI, shown_call_id
from zllm.api.errors import ApiError, finished_error
from zllm.api.ollama import wire
from zllm.canonical import (
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)

log = logging.getLogger("zllm.api")

Kind = Literal["chat", "generate"]
Clock = Callable[[], int]  # nanoseconds, monotonic


def ollama_error_body(error: ApiError) -> dict:
    return {"error": error.message}


def encode_line(obj: dict) -> bytes:
    """One NDJSON line. json.dumps never emits a raw newline, so a line is always one object."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def timestamp(unix_s: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama's `created_at` / `modified_at`."""
    moment = datetime.now(UTC) if unix_s is None else datetime.fromtimestamp(unix_s, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def tool_call_arguments(text: str) -> dict:
    """Ollama sends arguments as an object. Text that is not one (an unfenced model's slip) is kept, not lost."""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError:
        arguments = None
    if isinstance(arguments, dict):
        return arguments
    log.warning("tool call arguments are not a JSON object; sending them as text: %.80s", text)
    return {"_raw_arguments": text}


class Timings:
    """The request's clock: started when it arrived; the first event ends prompt evaluation."""

    def __init__(self, clock: Clock = time.perf_counter_ns):
        self.clock = clock
        self.started = clock()
        self.first_event: int | None = None

    def saw_event(self) -> None:
        if self.first_event is None:
            self.first_event = self.clock()

    def final_fields(self, finished: Finished) -> dict:
        ended = self.clock()
        first = self.first_event if self.first_event is not None else ended
        usage = finished.usage
        return {
            "done_reason": wire.DONE_REASONS.get(finished.reason, "stop"),
            "total_duration": ended - self.started,
            "load_duration": 0,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": first - self.started,
            "eval_count": usage.completion_tokens,
            "eval_duration": ended - first,
            "zllm": {"cached_tokens": usage.cached_tokens},
        }


def load_answer(kind: Kind, model: str) -> dict:
    """The answer to a request with no prompt: the model is loaded (it always is), nothing generated."""
    return {**_head(model), **answer_body(kind, {}), "done": True, "done_reason": wire.LOAD}


def _head(model: str) -> dict:
    return {"model": model, "created_at": timestamp()}


def answer_body(kind: Kind, part: dict) -> dict:
    """Text, reasoning and tool calls where `kind` puts them: a chat `message`, or generate's top level."""
    if kind == "chat":
        return {"message": {"role": "assistant", "content": part.get("content", ""),
                            **{k: v for k, v in part.items() if k != "content"}}}
    body = {"response": part.get("content", "")}
    if "thinking" in part:
        body["thinking"] = part["thinking"]
    return body


def _tool_call(index: int, call_id: str, name: str, arguments: str) -> dict:
    return {"id": shown_call_id(call_id, OPENAI),
            "function": {"index": index, "name": name, "arguments": tool_call_arguments(arguments)}}


class OllamaStreamEncoder:
    """One streaming request: canonical events in, NDJSON objects out."""

    def __init__(self, *, kind: Kind, model: str, timings: Timings):
        self.kind = kind
        self.model = model
        self.timings = timings
        # index → [id, name, arguments so far]; a call goes out whole at its ToolCallEnd
        self._calls: dict[int, list[str]] = {}

    def start(self) -> list[dict]:
        return []  # Ollama sends nothing before the first piece of output

    def feed(self, event: Event) -> list[dict]:
        self.timings.saw_event()
        match event:
            case TextDelta(text=text):
                return [self._chunk({"content": text})] if text else []
            case ReasoningDelta(text=text):
                return [self._chunk({"thinking": text})] if text else []
            case ToolCallStart(index=index, id=call_id, name=name):
                self._calls[index] = [call_id, name, ""]
                return []
            case ToolCallArgsDelta(index=index, text=text):
                self._calls.setdefault(index, ["", "", ""])[2] += text
                return []
            case ToolCallEnd(index=index, arguments=arguments):
                call_id, name, _ = self._calls.pop(index, ["", "", ""])
                if self.kind != "chat":
                    return []  # /api/generate has no tools
                return [self._chunk({"tool_calls": [_tool_call(index, call_id, name, arguments)]})]
            case Finished():
                return self._finish(event)
        raise TypeError(f"not a canonical event: {event!r}")

    def fail(self, error: ApiError) -> list[dict]:
        return [ollama_error_body(error)]

    def heartbeat(self) -> list[dict]:
        return []  # never asked for: NDJSON streams are not kept alive (ndjson.py)

    def _finish(self, finished: Finished) -> list[dict]:
        if finished.reason is FinishReason.ABORT:
            return []
        if finished.reason is FinishReason.ERROR:
            return self.fail(finished_error(finished))
        done = self.timings.final_fields(finished)
        return [{**_head(self.model), **answer_body(self.kind, {}), "done": True, **done}]

    def _chunk(self, part: dict) -> dict:
        return {**_head(self.model), **answer_body(self.kind, part), "done": False}
