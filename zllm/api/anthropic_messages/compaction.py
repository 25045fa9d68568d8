"""A Messages request's context edits applied, compaction (`compact_20260112`) included:

    edited = await edit_request(engine, call)   # before submit
    edited.request              # what to submit: old tool results / reasoning cleared, or the compacted turn
    edited.context_management   # the answer's `context_management` (None when the request sent no edits)
    edited.summary              # the summary compaction wrote this turn (None: no compaction)

Compaction, as Anthropic does it: when the prompt (after the clearing edits) passes the edit's trigger, the
served model summarises the conversation (the summariser Responses compaction uses, api/summary.py, with the
edit's `instructions` as the prompt when given), and the turn continues from the system prompt and the summary
alone. The answer carries the summary as its first block,

    {"type": "compaction", "content": "…summary…"}      (streamed: content_block_start, one compaction_delta)

followed by what the model then writes; with `pause_after_compaction` it is the whole answer (stop reason
"compaction"). The client sends the block back in the assistant message, and everything before it is dropped
(conversation.py): later turns continue from the summary, and hit the prefix cache on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zllm import ids
from zllm.api.anthropic_messages.context_management import applied_edits_body
from zllm.api.anthropic_messages.decode import MessagesCall
from zllm.api.context_edits import Compact, apply_context_edits
from zllm.api.summary import Summary, summary_message, summary_request, write_summary
from zllm.canonical import ChatRequest, EngineClient


@dataclass(frozen=True)
class EditedRequest:
    request: ChatRequest
    context_management: dict | None = None
    summary: Summary | None = None
    pause: bool = False  # answer with the summary alone


async def edit_request(engine: EngineClient, call: MessagesCall) -> EditedRequest:
    if call.edits is None:
        return EditedRequest(call.request)
    edited = await apply_context_edits(call.request, call.edits, engine)
    answer = applied_edits_body(edited.applied)
    compact = call.edits.of(Compact)
    summary = await compact_if_due(engine, edited.request, compact) if compact is not None else None
    if summary is None:
        return EditedRequest(edited.request, answer)
    return EditedRequest(compacted(edited.request, summary), answer, summary, compact.pause_after)


async def compact_if_due(engine: EngineClient, request: ChatRequest, edit: Compact) -> Summary | None:
    """The conversation's summary when its prompt passes the trigger; None below it."""
    if await engine.count_tokens(request) <= edit.trigger:
        return None
    return await write_summary(engine, summary_request(request, instructions=edit.instructions,
                                                       request_id=ids.request_id()))


def compacted(request: ChatRequest, summary: Summary) -> ChatRequest:
    """The turn continued from its system prompt and the summary alone."""
    system = request.messages[:1] if request.messages[0].role == "system" else ()
    note = (f"context edit: {len(request.messages) - len(system)} messages compacted into a "
            f"{summary.usage.completion_tokens}-token summary (the summary's prompt was {summary.usage.prompt_tokens} "
            f"tokens, {summary.usage.cached_tokens} of them cached)")
    return replace(request, messages=(*system, summary_message(summary.text)), notes=(*request.notes, note))
