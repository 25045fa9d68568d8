"""The local model writes the summary that replaces a conversation's history, in OpenAI's two forms:

    POST /v1/responses/compact {"model", "input": [items…], "instructions"?, "tools"?, "previous_response_id"?}
      → {"id": "resp_…", "object": "response.compaction", "created_at": …,
         "output": [the user messages of `input`…, {"type": "compaction", "id": "cmp_…", "encrypted_content"}],
         "usage": {…}}

    POST /v1/responses {…, "input": [items…, {"type": "compaction_trigger"}]}       (Codex's newer form)
      → a response whose `output` is exactly one `compaction` item, streamed or not:
        response.created → response.in_progress → response.output_item.added {item: {type: "compaction", …}}
        → response.compaction.compacting → response.output_item.done {item: {…, encrypted_content}}
        → response.completed

The summary request is the conversation as the client sent it (same instructions, tools and history, so its
prompt is the last turn's prompt and comes from the prefix cache) plus one user message asking for the
summary; no tool is called and no reasoning is asked for. The client sends the `compaction` item back as
the start of its next input and zllm expands it (compaction_seal.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zllm import ids
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.chain import ResponseChain
from zllm.api.openai_responses.compaction_seal import COMPACTION, COMPACTION_ID, CompactionSeal
from zllm.api.openai_responses.decode import Plan, ResponsesCall, chat_request, decode_responses_request, plan_turn
from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.response_object import usage_body
from zllm.api.openai_responses.tools import ToolSet
from zllm.api.summary import SUMMARY_MAX_TOKENS, SUMMARY_PROMPT, write_summary
from zllm.api.summary import summary_request as summary_of
from zllm.canonical import ChatRequest, EngineClient, Event, Finished, FinishReason, TextDelta
from zllm.errors import InvalidRequest

__all__ = ["SUMMARY_MAX_TOKENS", "SUMMARY_PROMPT", "CompactionEventEncoder", "compact", "summary_request"]

COMPACTED_OBJECT = "response.compaction"


def summary_request(call: ResponsesCall, plan: Plan, *, request_id: str, namespace: str) -> ChatRequest:
    turn = chat_request(call, plan, request_id=request_id, namespace=namespace)
    return summary_of(turn, max_tokens=call.sampling.max_tokens)


class CompactionEventEncoder(ResponseEventEncoder):
    """The events of a `compaction_trigger` turn: the summary's text is kept, not shown, and ends up sealed
    in the one `compaction` output item. A summary cut at its token budget is still a summary: completed."""

    def __init__(self, response: dict, tools: ToolSet, *, seal: CompactionSeal,
                 on_finish: Callable[[dict], None] | None = None, mint: Callable[[str], str] = ids.new_id,
                 clock: Callable[[], float] = time.time):
        super().__init__(response, tools, on_finish=on_finish, mint=mint, clock=clock)
        self.seal = seal
        self._item = None

    def feed(self, event: Event) -> list[dict]:
        events = self._open_item()
        if isinstance(event, TextDelta):
            self._item.pieces.append(event.text)
        elif isinstance(event, Finished):
            events += self._finish_compaction(event)
        return events  # reasoning and tool calls are no part of a summary

    def _open_item(self) -> list[dict]:
        if self._item is not None:
            return []
        self._item = self._open({"type": COMPACTION, "id": self._mint(COMPACTION_ID), "encrypted_content": ""})
        return [self._added(self._item),
                self._emit("response.compaction.compacting", **self._where(self._item))]

    def _finish_compaction(self, finished: Finished) -> list[dict]:
        if finished.reason in (FinishReason.ERROR, FinishReason.ABORT):
            self._output.clear()  # no half-made item: the response failed (or was cancelled) as a whole
            return self._finish(finished)
        sealed = {**self._item.item, "encrypted_content": self.seal.seal(self._item.text.strip())}
        return [self._done(self._item, sealed), self._terminal(wire.STATUS_COMPLETED, finished.usage)]


async def compact(body: dict, *, engine: EngineClient, chain: ResponseChain, namespace: str) -> dict:
    """`POST /v1/responses/compact`: the summary written, sealed, and returned after the input's user messages."""
    if body.get("stream"):
        raise InvalidRequest("/v1/responses/compact does not stream", param="stream")
    call = decode_responses_request(body, seal=chain.seal)
    if chain.seal is None:
        raise InvalidRequest("compaction is not available here")
    plan = plan_turn(call, await chain.previous(call.previous_response_id, namespace))
    written = await write_summary(engine, summary_request(call, plan, request_id=ids.request_id(),
                                                          namespace=namespace))
    summary = chain.seal.seal(written.text)
    return {
        "id": ids.new_id(wire.RESPONSE_ID), "object": COMPACTED_OBJECT, "created_at": int(time.time()),
        "output": [*_user_messages(body.get("input")),
                   {"type": COMPACTION, "id": ids.new_id(COMPACTION_ID), "encrypted_content": summary}],
        "usage": usage_body(written.usage, reasoning_tokens=0),
    }


def _user_messages(raw: object) -> list[dict]:
    """The input's user messages, kept word for word next to the summary (as OpenAI keeps them)."""
    if isinstance(raw, str):
        raw = [{"type": wire.MESSAGE, "role": "user", "content": raw}]
    kept = []
    for item in raw or []:
        if item.get("type", wire.MESSAGE) != wire.MESSAGE or item.get("role") != "user":
            continue
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        kept.append({"type": wire.MESSAGE, "id": ids.new_id(wire.MESSAGE_ID), "status": wire.STATUS_COMPLETED,
                     "role": "user", "content": parts})
    return kept
