"""Canonical events → one Anthropic `message` object (non-streaming answers):

    {"id": "msg_…", "type": "message", "role": "assistant", "model": "m",
     "content": [{"type": "thinking", "thinking": "hmm", "signature": "zllm1.…"},
                 {"type": "text", "text": "Let me look."},
                 {"type": "tool_use", "id": "toolu_…", "name": "sh", "input": {"cmd": "ls"}}],
     "stop_reason": "tool_use", "stop_sequence": null,
     "usage": {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
               "output_tokens": 12}}

Built by running the streaming encoder and accumulating its frames the way the SDK's `.stream()` helper
does, so a streamed and a non-streamed answer to the same events always agree (blocks, ids, signatures).
"""

from __future__ import annotations

import json
import logging

from zllm.api.anthropic_messages.encode import MessagesStreamEncoder
from zllm.api.collect import raise_unless_completed
from zllm.api.sse import SseMessage
from zllm.canonical import Event, Finished

log = logging.getLogger("zllm.api")


class MessageBuilder:
    def __init__(self, encoder: MessagesStreamEncoder):
        self._encoder = encoder
        self._message: dict = {}
        self._tool_json: dict[int, str] = {}  # block index → input JSON text streamed so far
        self._finished: Finished | None = None
        self._apply(encoder.start())

    def feed(self, event: Event) -> None:
        if isinstance(event, Finished):
            self._finished = event
        self._apply(self._encoder.feed(event))

    def result(self) -> dict:
        """The message; raises the engine's error for ERROR, `Overloaded` (retryable) for ABORT."""
        raise_unless_completed(self._finished)
        return self._message

    def _apply(self, frames: list[SseMessage]) -> None:
        for message in frames:
            data = message.data
            assert isinstance(data, dict)
            match data["type"]:
                case "message_start":
                    self._message = json.loads(json.dumps(data["message"]))  # a deep copy of plain JSON
                case "content_block_start":
                    self._message["content"].append(dict(data["content_block"]))
                case "content_block_delta":
                    self._apply_delta(data["index"], data["delta"])
                case "content_block_stop":
                    self._finish_block(data["index"])
                case "message_delta":
                    self._message.update(data["delta"])
                    self._message["usage"] = data["usage"]

    def _apply_delta(self, index: int, delta: dict) -> None:
        block = self._message["content"][index]
        match delta["type"]:
            case "text_delta":
                block["text"] += delta["text"]
            case "thinking_delta":
                block["thinking"] += delta["thinking"]
            case "signature_delta":
                block["signature"] = delta["signature"]
            case "input_json_delta":
                self._tool_json[index] = self._tool_json.get(index, "") + delta["partial_json"]

    def _finish_block(self, index: int) -> None:
        block = self._message["content"][index]
        if block["type"] == "tool_use":
            block["input"] = _tool_input(self._tool_json.get(index, ""), block["name"])


def _tool_input(arguments: str, name: str) -> dict:
    """The parsed arguments object; `{}` (logged) when the model wrote something else."""
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    log.warning("tool call %s: arguments are not a JSON object; sending input {}: %.200r", name, arguments)
    return {}
