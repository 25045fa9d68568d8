"""Clearing old tool uses, placed where it keeps the prefix cache.

A tool use is one call of an assistant message and the tool message answering it. Clearing one replaces the
result's text by `PLACEHOLDER` (and, where asked, the call's arguments by `{}`); the most recent `keep` tool
uses and the calls of `exclude_tools` are never cleared.

The client resends its whole unedited history every turn, so the edit is recomputed every turn, and where it
is placed decides what it costs. Applied the stateless way (every turn whose full history passes the
trigger clears all but the last `keep`), the cleared block grows by one tool use each turn: each turn's prompt
differs from the last one's at the newly cleared result, and everything after it is prefilled again. Here
instead the decision is replayed over the conversation's turns (every assistant message marks the end of a
past request's prompt) with hysteresis:

    cleared = 0
    for each past turn's prompt, and this one:
        if the prompt, with `cleared` tool uses cleared, passes the trigger:
            clear every tool use but the last `keep` at once (nothing when that frees < clear_at_least tokens)

The trigger is measured on the edited prompt, so after one activation the prompt stays as it was (same
cleared block, same tokens: a prefix cache hit) for as many turns as the freed room lasts; clearing every
candidate at once frees the most room and re-prefills the least (cleared results are short). The replay uses
per-message token weights that are the same every turn (sizes.py), so every turn reaches the same decisions
for the turns it shares with the last one. An activation in this very turn costs a re-prefill from the first
newly cleared message to the end: `Outcome.reprefill_tokens`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from zllm.api.context_edits.sizes import TokenSizes
from zllm.api.context_edits.specs import INPUT_TOKENS, ClearToolUses
from zllm.canonical import Message, ToolCall

PLACEHOLDER = "[This tool result was cleared to save context space.]"
CLEARED_INPUT = "{}"


@dataclass(frozen=True)
class ToolUse:
    call_message: int  # index of the assistant message that made the call
    call_position: int  # the call's index among that message's calls
    name: str
    result_message: int | None  # index of the tool message answering it (None: not answered yet)


@dataclass(frozen=True)
class Outcome:
    messages: tuple[Message, ...]
    cleared: int  # tool uses cleared in this prompt
    cleared_tokens: int  # what that clearing frees
    reprefill_tokens: int  # prompt tokens after the first message this turn's own activation changed (0: none)


def clear_tool_uses(messages: Sequence[Message], edit: ClearToolUses, sizes: TokenSizes) -> Outcome:
    line = _Timeline(messages, edit, sizes)
    cleared, changed_from = 0, None
    for end in _prompt_ends(messages):
        if not line.triggered(end, cleared):
            continue
        available = line.clearable(end)
        if available > cleared and line.freed(cleared, available) >= edit.clear_at_least:
            first = min(_first_changed(line.candidates[i], edit) for i in range(cleared, available))
            cleared, changed_from = available, (first if end == len(messages) else None)
    edited = _apply(messages, line.candidates[:cleared], edit)
    reprefill = 0 if changed_from is None else sum(sizes.message(m) for m in edited[changed_from:])
    return Outcome(edited, cleared, line.freed(0, cleared), reprefill)


def find_tool_uses(messages: Sequence[Message]) -> list[ToolUse]:
    results = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool" and m.tool_call_id}
    return [ToolUse(i, j, call.name, results.get(call.id))
            for i, message in enumerate(messages) for j, call in enumerate(message.tool_calls)]


def _prompt_ends(messages: Sequence[Message]) -> list[int]:
    """Where each past request's prompt ended (before each assistant message), then this request's end."""
    return [i for i, m in enumerate(messages) if m.role == "assistant"] + [len(messages)]


class _Timeline:
    """The conversation's tool uses and weights as prefix sums: each replayed turn's question in O(log n), so a
    session of a thousand messages replays in milliseconds."""

    def __init__(self, messages: Sequence[Message], edit: ClearToolUses, sizes: TokenSizes):
        self.edit, self.tools_tokens = edit, sizes.tools_tokens
        self.uses = find_tool_uses(messages)  # in conversation order
        self.candidates = [use for use in self.uses if use.name not in edit.exclude_tools]
        self._use_calls = [use.call_message for use in self.uses]
        self._candidate_keys = [(use.call_message, use.call_position) for use in self.candidates]
        self._weights = list(accumulate((sizes.message(m) for m in messages), initial=0))
        self._savings = list(accumulate((_saving(messages, use, edit, sizes) for use in self.candidates),
                                        initial=0))

    def freed(self, start: int, stop: int) -> int:
        """Tokens freed by clearing candidates [start, stop)."""
        return self._savings[stop] - self._savings[start]

    def triggered(self, end: int, cleared: int) -> bool:
        """Whether the prompt ending at `end`, with the first `cleared` candidates cleared, passes the trigger."""
        if self.edit.trigger.unit == INPUT_TOKENS:
            # the cleared tool uses all lie before `end`: they were candidates of an earlier (or this) prompt
            return self.tools_tokens + self._weights[end] - self.freed(0, cleared) > self.edit.trigger.value
        return self._made_before(end) - cleared > self.edit.trigger.value

    def clearable(self, end: int) -> int:
        """How many candidates (oldest first) the prompt ending at `end` may clear: those older than its last
        `keep` tool uses."""
        protected_from = max(0, self._made_before(end) - self.edit.keep)
        if protected_from >= len(self.uses):
            return len(self.candidates)
        oldest_kept = self.uses[protected_from]
        return bisect_left(self._candidate_keys, (oldest_kept.call_message, oldest_kept.call_position))

    def _made_before(self, end: int) -> int:
        return bisect_left(self._use_calls, end)


def _first_changed(use: ToolUse, edit: ClearToolUses) -> int:
    """The first message clearing `use` changes: its call where the arguments go too, else its result."""
    if edit.clears_input_of(use.name) or use.result_message is None:
        return use.call_message
    return use.result_message


def _saving(messages: Sequence[Message], use: ToolUse, edit: ClearToolUses, sizes: TokenSizes) -> int:
    saving = 0
    if use.result_message is not None:
        saving += sizes.text(messages[use.result_message].content) - sizes.text(PLACEHOLDER)
    if edit.clears_input_of(use.name):
        arguments = messages[use.call_message].tool_calls[use.call_position].arguments
        saving += sizes.text(arguments) - sizes.text(CLEARED_INPUT)
    return saving


def _apply(messages: Sequence[Message], cleared: list[ToolUse], edit: ClearToolUses) -> tuple[Message, ...]:
    edited = list(messages)
    for use in cleared:
        if use.result_message is not None:
            edited[use.result_message] = replace(edited[use.result_message], content=PLACEHOLDER)
        if edit.clears_input_of(use.name):
            calls = list(edited[use.call_message].tool_calls)
            calls[use.call_position] = ToolCall(calls[use.call_position].id, use.name, CLEARED_INPUT)
            edited[use.call_message] = replace(edited[use.call_message], tool_calls=tuple(calls))
    return tuple(edited)
