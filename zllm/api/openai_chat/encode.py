"""Canonical events → OpenAI Chat Completions streaming chunks (folded into one `chat.completion` object for a
non-streaming answer: completion.py).

Streaming (data-only SSE; each line below is one `data:` frame):

    {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,
     "choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}
    … "delta":{"content":"Hel"} …
    … "delta":{"reasoning_content":"hmm"} …
    … "delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"sh","arguments":""}}]} …
    … "delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":"}}]} …
    … "delta":{},"finish_reason":"tool_calls" …
    {…,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12,
                             "prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{…}}}
    [DONE]

While nothing else is sent (a long prefill) the stream pump sends `heartbeat()` once a minute (api/stream_pump.py): a
chunk whose delta is `{"content":""}`, the shape of the first chunk, which every client already handles and
which adds nothing to the answer (a chunk with no choices would break clients that index `choices[0]` without
having asked for usage). Comments go out too, but watchdogs that count events (Codex's) never see those.

The usage chunk is sent only with `stream_options.include_usage` (and then every chunk carries
`"usage": null`, as OpenAI does). ERROR ends the stream with `{"error": {…}}` and no [DONE]; ABORT just ends it.
"""

from __future__ import annotations

import logging

from zllm.api.call_ids import OPENAI, shown_call_id
from zllm.api.errors import ApiError, finished_error, openai_error_body
from zllm.api.openai_chat import wire
from zllm.api.sse import SsePayload
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


def usage_body(usage: Usage, *, saw_reasoning: bool) -> dict:
    # The canonical Usage does not count reasoning tokens separately: report 0 only when there was none,
    # rather than a wrong number.
    completion_details = {} if saw_reasoning else {"reasoning_tokens": 0}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        # read from the prefix cache / prefilled and handed to it to keep (0 with the cache off)
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": usage.cache_write_tokens},
        "completion_tokens_details": completion_details,
    }


class ChatStreamEncoder:
    """One streaming request's state machine: canonical events in, chunk dicts (and "[DONE]") out."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool):
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self._saw_reasoning = False
        # tool call index → argument text already streamed, to send only what ToolCallEnd adds
        self._streamed_args: dict[int, str] = {}
        self._ended = False  # the finish chunk (or an error) went out: nothing may follow

    def heartbeat(self) -> list[SsePayload]:
        return [] if self._ended else [self._chunk({"content": ""})]

    def start(self) -> list[SsePayload]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, event: Event) -> list[SsePayload]:
        match event:
            case TextDelta(text=text):
                return [self._chunk({"content": text})] if text else []
            case ReasoningDelta(text=text):
                self._saw_reasoning = True
                return [self._chunk({wire.REASONING_FIELD: text})] if text else []
            case ToolCallStart():
                return [self._tool_call_start(event)]
            case ToolCallArgsDelta(index=index, text=text):
                return self._tool_call_arguments(index, text)
            case ToolCallEnd(index=index, arguments=arguments):
                return self._tool_call_rest(index, arguments)
            case Finished():
                return self._finish(event)
        raise TypeError(f"not a canonical event: {event!r}")

    def fail(self, error: ApiError) -> list[SsePayload]:
        return [openai_error_body(error)]

    def _tool_call_start(self, event: ToolCallStart) -> dict:
        self._streamed_args[event.index] = ""
        call = {"index": event.index, "id": shown_call_id(event.id, OPENAI), "type": "function",
                "function": {"name": event.name, "arguments": ""}}
        return self._chunk({"tool_calls": [call]})

    def _tool_call_arguments(self, index: int, text: str) -> list[SsePayload]:
        if not text:
            return []
        self._streamed_args[index] = self._streamed_args.get(index, "") + text
        return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})]

    def _tool_call_rest(self, index: int, arguments: str) -> list[SsePayload]:
        # A dialect that only knows the arguments at the end sends them here; stream what is still missing.
        streamed = self._streamed_args.get(index, "")
        if not arguments.startswith(streamed):
            log.warning("tool call %d: final arguments do not extend the streamed ones; keeping the stream", index)
            return []
        return self._tool_call_arguments(index, arguments[len(streamed):])

    def _finish(self, finished: Finished) -> list[SsePayload]:
        self._ended = True
        if finished.reason is FinishReason.ABORT:
            return []
        if finished.reason is FinishReason.ERROR:
            return self.fail(finished_error(finished))
        frames: list[SsePayload] = [self._chunk({}, finish_reason=wire.FINISH_REASONS[finished.reason])]
        if self.include_usage:
            frames.append(self._envelope([], usage=usage_body(finished.usage, saw_reasoning=self._saw_reasoning)))
        frames.append(wire.DONE)
        return frames

    def _chunk(self, delta: dict, *, finish_reason: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope([choice], usage=None)

    def _envelope(self, choices: list, *, usage: dict | None) -> dict:
        chunk = {
            "id": self.completion_id,
            "object": wire.CHAT_COMPLETION_CHUNK,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        return chunk
