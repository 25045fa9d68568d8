"""Known per-session prompt content that defeats the prefix cache, removed before the template runs.

Claude Code sends, as the very first system block, a line that changes per session (its suffix depends on
the first user prompt) and means nothing to the model:

    x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli; cch=5e1f0;

Being first, it makes every cross-session prefix miss after a handful of tokens (the `cc_version` suffix and
the `cch=` hash change per session). Every API path keeps it in the canonical request and leaves it to this
function, so it is removed, and reported, the same way whether it came as Anthropic's first system block,
through an OpenAI-compatible proxy, or merged into a larger system message: each line of a system message
that starts with it goes, and the message goes when nothing else is left. What was removed is reported back
so the trace can say so.

Other busters change what the model reads, so they are *reported*, not removed (`reported_busters`): the trace
notes them and `explain-miss` / the cache diagnostics name them when a miss falls on one.

- a system message in the middle of the conversation (Claude Code's "# Environment …" turn, with the date and
  the deferred tool list): when its text changes, nothing after it can be reused;
- a trailing `<system-reminder>` about the tokens or context left (Claude Code 2.1.233+): it rides on the
  newest user message, moves with every turn, and the previous turn's copy is rewritten or dropped, so the
  previous prompt diverges right there.
"""

from __future__ import annotations

import dataclasses
import logging
import re

from zllm.canonical import Message

log = logging.getLogger("zllm.prompt")

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
_logged_once = False
# a <system-reminder> that ends a user message and speaks of tokens or context left
_TOKENS_LEFT = re.compile(
    r"<system-reminder>(?:(?!</system-reminder>).)*?\b(?:tokens?\s+(?:left|remaining)|remaining\s+tokens|"
    r"context\s+(?:left|remaining)|token\s+usage|token\s+budget)\b(?:(?!</system-reminder>).)*</system-reminder>\s*$",
    re.IGNORECASE | re.DOTALL)
MID_CONVERSATION_SYSTEM = "mid-conversation system message"
TOKENS_LEFT_REMINDER = "trailing tokens-left reminder"


def drop_billing_headers(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], tuple[str, ...]]:
    """(messages without the header lines, the header lines removed)."""
    kept: list[Message] = []
    removed: list[str] = []
    for message in messages:
        if message.role != "system" or BILLING_HEADER_PREFIX not in message.content:
            kept.append(message)
            continue
        lines = message.content.lstrip().split("\n")
        headers = [line for line in lines if line.startswith(BILLING_HEADER_PREFIX)]
        if not headers:  # the prefix inside a line of prose: not the header
            kept.append(message)
            continue
        removed.extend(headers)
        # the separators that joined the header block to the next one go with it
        rest = "\n".join(line for line in lines if not line.startswith(BILLING_HEADER_PREFIX)).lstrip("\n")
        if rest.strip():
            kept.append(dataclasses.replace(message, content=rest))
    if removed:
        _log_removed(removed)
    return tuple(kept), tuple(removed)


def reported_busters(messages: tuple[Message, ...]) -> tuple[tuple[int, str], ...]:
    """(message index, what) for each buster left in the prompt because removing it would change what the
    model reads (see the module doc)."""
    found: list[tuple[int, str]] = []
    seen_conversation = False
    for i, message in enumerate(messages):
        if message.role == "system" and seen_conversation and message.content.strip():
            found.append((i, MID_CONVERSATION_SYSTEM))
        if message.role != "system":
            seen_conversation = True
        if message.role == "user" and _TOKENS_LEFT.search(message.content):
            found.append((i, TOKENS_LEFT_REMINDER))
    return tuple(found)


def describe_busters(dropped: tuple[str, ...], reported: tuple[tuple[int, str], ...]) -> tuple[str, ...]:
    """One trace note per buster: "dropped per-session line: …" or "mid-conversation system message in
    message 2 (reported: …)"."""
    notes = [f"dropped per-session line: {line[:80]}" for line in dropped]
    for index, what in reported:
        notes.append(f"{what} in message {index} (kept: the model reads it; the cache cannot reuse past it "
                     "when it changes)")
    return tuple(notes)


def _log_removed(removed: list[str]) -> None:
    global _logged_once
    level = logging.DEBUG if _logged_once else logging.INFO  # once at info: every Claude Code request has one
    _logged_once = True
    log.log(level, "dropped %d per-session system line(s) that would defeat the prefix cache: %s",
            len(removed), "; ".join(line[:80] for line in removed))
