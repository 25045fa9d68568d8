"""Known per-session prompt content that defeats the prefix cache, removed before the template runs.

Claude Code sends, as the very first system block, a line that changes per session (its suffix depends on
the first user prompt) and means nothing to the model:

    x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;

Being first, it makes every cross-session prefix miss after a handful of tokens. The Anthropic decoder
drops the block; this is the prompt-level guarantee for every API (an OpenAI-compatible proxy in front of
Claude Code, the header merged into a larger system message): a system message whose text starts with it
loses that first line, and is dropped when nothing else is left. What was removed is reported back so the
trace can say so.
"""

from __future__ import annotations

import dataclasses
import logging

from zllm.canonical import Message

log = logging.getLogger("zllm.prompt")

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
_logged_once = False


def drop_billing_headers(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], tuple[str, ...]]:
    """(messages without the header lines, the header lines removed)."""
    kept: list[Message] = []
    removed: list[str] = []
    for message in messages:
        if message.role != "system" or not message.content.lstrip().startswith(BILLING_HEADER_PREFIX):
            kept.append(message)
            continue
        header, _, rest = message.content.lstrip().partition("\n")
        removed.append(header)
        rest = rest.lstrip("\n")  # the separator that joined the header to the next block
        if rest.strip():
            kept.append(dataclasses.replace(message, content=rest))
    if removed:
        _log_removed(removed)
    return tuple(kept), tuple(removed)


def _log_removed(removed: list[str]) -> None:
    global _logged_once
    level = logging.DEBUG if _logged_once else logging.INFO  # once at info: every Claude Code request has one
    _logged_once = True
    log.log(level, "dropped %d per-session system line(s) that would defeat the prefix cache: %s",
            len(removed), "; ".join(line[:80] for line in removed))
