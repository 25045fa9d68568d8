"""Canonical events → one Anthropic `message` object (non-streaming answers):

    {"id": "msg_…", "type": "message", "role": "assistant", "model": "m",
     "content": [{"type": "thinking", "thinking": "hmm", "signature": "zllm1.…"},
                 {"type": "text", "text": "Let me look."},
                 {"type": "tool_use", "id": "toolu_…", "name": "sh", "input": {"cmd": "ls"}}],
     "stop_reason": "tool_use", "stop_sequence": null,
     "usage": {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
               "output_tokens": 12}}

Built as every API builds its non-streaming answer (api/collect.StreamedAnswer): the streaming encoder run
to the end, its frames accumulated the way the SDK's `.stream()` helper does, so a streamed and a
non-streamed answer to the same events always agree (blocks, ids, signatures, stop reason).
"""

from __future__ import annotations

import json
import logging

from zllm.api.anthropic_messages.encode import MessagesStreamEncoder
from zllm.api.collect import StreamedAnswer
from zllm.api.sse import SseMessage

log = logging.getLogger("zllm.api")


class MessageBuilder(StreamedAnswer):
    def __init__(self, encoder: MessagesStreamEncoder):
        super().__init__(encoder, MessageFold())


class MessageFold:
    """Anthropic SSE frames → the `message` object, as the SDK's `.stream()` accumulates them."""

    def __init__(self) -> None:
        self._message: dict = {}
        self._tool_json: dict[int, str] = {}  # block index → input JSON text streamed so far

    def result(self) -> dict:
        return self._message

    def apply(self, frame: SseMessage) -> None:
        data = frame.data
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
                # field by field, as the SDK's stream helper merges: the delta adds the output to the start's split
                self._message["usage"].update({k: v for k, v in data["usage"].items() if v is not None})
                if "context_management" in data:
                    self._message["context_management"] = data["context_management"]

    def _apply_delta(self, index: int, delta: dict) -> None:
        block = self._message["content"][index]
        match delta["type"]:
            case "text_delta":
                block["text"] += delta["text"]
            case "thinking_delta":
                block["thinking"] += delta["thinking"]
            case "signature_delta":
                block["signature"] = delta["signature"]
            case "compaction_delta":
                block["content"] = delta["content"]
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
