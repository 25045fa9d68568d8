"""Clearing the reasoning of older assistant turns (Anthropic's clear_thinking: keep the last N turns' thinking).

A thinking turn is an assistant message that carries reasoning. With `keep` N, every thinking turn but the
last N loses its reasoning; N None keeps them all (no change: the cache-friendly setting Claude Code sends).
Only reasoning the template renders costs prompt tokens: many templates drop past turns' reasoning themselves,
and then clearing it changes nothing in the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from zllm.api.context_edits.sizes import TokenSizes
from zllm.api.context_edits.specs import ClearThinking
from zllm.canonical import Message


@dataclass(frozen=True)
class Outcome:
    messages: tuple[Message, ...]
    cleared: int  # thinking turns cleared
    cleared_tokens: int
    reprefill_tokens: int  # prompt tokens after the first message cleared now and not in the last turn's prompt


def clear_thinking(messages: Sequence[Message], edit: ClearThinking, sizes: TokenSizes) -> Outcome:
    cleared = _cleared_turns(messages, len(messages), edit)
    edited = list(messages)
    for i in cleared:
        edited[i] = replace(edited[i], reasoning=None)
    # the last turn's prompt ended before the newest assistant message: what it had not cleared is new now
    last_end = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=0)
    new = sorted(set(cleared) - set(_cleared_turns(messages, last_end, edit)))
    reprefill = sum(sizes.message(m) for m in edited[new[0]:]) if new else 0
    freed = sum(sizes.text(messages[i].reasoning or "") for i in cleared)
    return Outcome(tuple(edited), len(cleared), freed, reprefill)


def _cleared_turns(messages: Sequence[Message], end: int, edit: ClearThinking) -> list[int]:
    turns = [i for i, m in enumerate(messages[:end]) if m.role == "assistant" and m.reasoning]
    if edit.keep is None:
        return []
    return turns[:max(0, len(turns) - edit.keep)]
