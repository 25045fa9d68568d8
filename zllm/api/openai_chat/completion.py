"""The non-streaming `chat.completion` object: the stream encoder's chunks folded, as the SDK accumulates a
stream (api/collect.StreamedAnswer), so both answers to the same events agree:

    {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "system_fingerprint": null,
     "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "reasoning_content": "hmm",
                  "tool_calls": [{"id": "call_1", "type": "function",
                                  "function": {"name": "sh", "arguments": "{\\"cmd\\":\\"ls\\"}"}}]},
                  "logprobs": null, "finish_reason": "tool_calls"}],
     "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12, …}}

`content` is null when the answer is only tool calls, as OpenAI sends it.
"""

from __future__ import annotations

from zllm.api.collect import StreamedAnswer
from zllm.api.openai_chat import wire
from zllm.api.openai_chat.encode import ChatStreamEncoder
from zllm.api.sse import SsePayload


class ChatCompletionBuilder(StreamedAnswer):
    def __init__(self, *, completion_id: str, model: str, created: int):
        # the usage chunk is what the completion's usage is read from
        super().__init__(ChatStreamEncoder(completion_id=completion_id, model=model, created=created,
                                           include_usage=True), CompletionFold())


class CompletionFold:
    """Chat chunks → one `chat.completion`."""

    def __init__(self) -> None:
        self._head: dict = {}
        self._text: list[str] = []
        self._reasoning: list[str] | None = None  # None: the answer had no reasoning
        self._calls: dict[int, dict] = {}         # index → {"id", "name", "arguments"}
        self._finish_reason: str | None = None
        self._usage: dict | None = None

    def apply(self, chunk: SsePayload) -> None:
        if not isinstance(chunk, dict) or "choices" not in chunk:
            return  # [DONE], or an error body (the Finished event raises it)
        self._head = self._head or {key: chunk[key] for key in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in chunk["choices"]:
            self._apply_delta(choice["delta"])
            self._finish_reason = choice["finish_reason"] or self._finish_reason

    def _apply_delta(self, delta: dict) -> None:
        self._text.append(delta.get("content", ""))
        if wire.REASONING_FIELD in delta:
            self._reasoning = [*(self._reasoning or []), delta[wire.REASONING_FIELD]]
        for call in delta.get("tool_calls", []):
            known = self._calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            if "id" in call:
                known.update(id=call["id"], name=call["function"]["name"])
            known["arguments"] += call["function"].get("arguments", "")

    def result(self) -> dict:
        head = self._head
        return {
            "id": head["id"],
            "object": wire.CHAT_COMPLETION,
            "created": head["created"],
            "model": head["model"],
            "system_fingerprint": head["system_fingerprint"],
            "choices": [{"index": 0, "message": self._message(), "logprobs": None,
                         "finish_reason": self._finish_reason}],
            "usage": self._usage,
        }

    def _message(self) -> dict:
        text = "".join(self._text)
        message: dict = {"role": "assistant", "content": text if text or not self._calls else None}
        if self._reasoning is not None:
            message[wire.REASONING_FIELD] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [
                {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}
                for _, call in sorted(self._calls.items())
            ]
        return message
