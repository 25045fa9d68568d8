"""Context editing: a request's conversation trimmed before rendering, as the client asked (Anthropic's
`context_management.edits`), and placed so that the prefix cache keeps serving it.

    edits = ContextEdits((ClearThinking(keep=None), ClearToolUses(trigger=Threshold("input_tokens", 6000))))
    result = await apply_context_edits(request, edits, engine)   # engine: counts text tokens
    result.request      # the request to submit: old tool results cleared, its trace notes added
    result.applied      # what was cleared, for the response's `applied_edits`

The runtime never sees an edit: it gets the edited messages, and a note per edit for `zllm trace` saying what
the edit freed and what it cost in re-prefilled tokens. Compaction (a summary by the served model) runs in the
route, around the engine: compaction.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from zllm.api.context_edits.sizes import TextCounter, TokenSizes
from zllm.api.context_edits.specs import (
    INPUT_TOKENS,
    TOOL_USES,
    ClearThinking,
    ClearToolUses,
    Compact,
    ContextEdits,
    Threshold,
)
from zllm.api.context_edits.thinking import clear_thinking
from zllm.api.context_edits.tool_uses import CLEARED_INPUT, PLACEHOLDER, clear_tool_uses
from zllm.canonical import ChatRequest

__all__ = ["INPUT_TOKENS", "TOOL_USES", "AppliedEdit", "ClearThinking", "ClearToolUses", "Compact",
           "ContextEdits", "EditResult", "Threshold", "apply_context_edits"]


@dataclass(frozen=True)
class AppliedEdit:
    kind: Literal["clear_tool_uses", "clear_thinking"]
    cleared: int  # tool uses, or thinking turns
    cleared_tokens: int  # prompt tokens the clearing frees
    reprefill_tokens: int  # prompt tokens re-prefilled because this edit changed since the last turn


@dataclass(frozen=True)
class EditResult:
    request: ChatRequest
    applied: tuple[AppliedEdit, ...] = ()


async def apply_context_edits(request: ChatRequest, edits: ContextEdits, counter: TextCounter) -> EditResult:
    # keep-all thinking (what Claude Code sends on every request) changes nothing: not worth weighing the prompt
    clearing = [edit for edit in edits.edits
                if isinstance(edit, ClearToolUses) or (isinstance(edit, ClearThinking) and edit.keep is not None)]
    if not clearing:
        return EditResult(request)
    sizes = await TokenSizes.measure(counter, request.messages, request.tools, extra=(PLACEHOLDER, CLEARED_INPUT))
    messages, applied = request.messages, []
    for edit in clearing:  # in the client's order, each on what the one before left
        if isinstance(edit, ClearToolUses):
            outcome, kind = clear_tool_uses(messages, edit, sizes), "clear_tool_uses"
        else:
            outcome, kind = clear_thinking(messages, edit, sizes), "clear_thinking"
        messages = outcome.messages
        if outcome.cleared:
            applied.append(AppliedEdit(kind, outcome.cleared, outcome.cleared_tokens, outcome.reprefill_tokens))
    notes = tuple(trace_note(edit) for edit in applied)
    return EditResult(replace(request, messages=messages, notes=(*request.notes, *notes)), tuple(applied))


def trace_note(edit: AppliedEdit) -> str:
    what = "old tool results" if edit.kind == "clear_tool_uses" else "turns' reasoning"
    cost = (f"changed this turn: ~{edit.reprefill_tokens} tokens re-prefilled" if edit.reprefill_tokens
            else "same as the last turn: no re-prefill")
    return f"context edit: {edit.cleared} {what} cleared (~{edit.cleared_tokens} tokens freed), {cost}"
