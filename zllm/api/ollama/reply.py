"""The `stream: false` answer of /api/chat and /api/generate: the stream encoder's lines folded into one
object (api/collect.StreamedAnswer), so both answers to the same events agree. The text, reasoning and tool
calls of every line are joined; the durations and counts are the last (`done`) line's."""

from __future__ import annotations

from zllm.api.collect import StreamedAnswer
from zllm.api.ollama.encode import Kind, OllamaStreamEncoder, Timings, answer_body

# where a line carries its output, per kind (chat: in `message`; generate: at the top level)
_OUTPUT_KEYS = ("message", "response", "thinking")


class OllamaReplyBuilder(StreamedAnswer):
    def __init__(self, *, kind: Kind, model: str, timings: Timings):
        super().__init__(OllamaStreamEncoder(kind=kind, model=model, timings=timings), ReplyFold(kind))


class ReplyFold:
    """Ollama NDJSON lines → the one answer object."""

    def __init__(self, kind: Kind):
        self.kind = kind
        self._text: list[str] = []
        self._thinking: list[str] | None = None  # None: the answer had no reasoning
        self._calls: list[dict] = []
        self._last: dict = {}

    def apply(self, line: dict) -> None:
        if "error" in line:
            return  # the Finished event raises it
        output = line.get("message", line)
        self._text.append(output.get("content", output.get("response", "")))
        if "thinking" in output:
            self._thinking = [*(self._thinking or []), output["thinking"]]
        self._calls += output.get("tool_calls", [])
        self._last = line

    def result(self) -> dict:
        part: dict = {"content": "".join(self._text)}
        if self._thinking is not None:
            part["thinking"] = "".join(self._thinking)
        if self._calls:
            part["tool_calls"] = self._calls
        last = self._last
        rest = {key: value for key, value in last.items() if key not in ("model", "created_at", *_OUTPUT_KEYS)}
        return {"model": last["model"], "created_at": last["created_at"], **answer_body(self.kind, part), **rest}
