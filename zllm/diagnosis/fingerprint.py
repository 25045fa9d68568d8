"""A request's prompt fingerprint (records.py; kept by fingerprint_store.py): digests of its parts plus its prompt
token ids.

Digests are taken after cache-buster normalization (busters.py), the same the renderer applies: two
Claude Code sessions that differ only in their billing header have equal system digests, as they have equal
prompt tokens. Message digests are by index into the canonical `ChatRequest.messages`, the numbering
segments.py uses ("message 3 (user)"); a message the normalization removed entirely digests as "".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Protocol

from zllm.canonical import ChatRequest, FunctionTool, Message
from zllm.diagnosis.busters import drop_billing_headers, reported_busters
from zllm.diagnosis.records import RequestFingerprint


class RenderedPrompt(Protocol):
    """What a fingerprint reads of zllm.prompt's `RenderedPrompt`."""

    token_ids: Sequence[int]
    dropped: tuple[str, ...]  # the per-session lines normalization removed


def fingerprint_request(request: ChatRequest, prompt: RenderedPrompt) -> RequestFingerprint:
    messages = tuple(_message_digest(message) for message in request.messages)
    first = request.messages[0]
    busters = tuple(f"normalized: {line[:80]}" for line in prompt.dropped)
    busters += tuple(f"{what} in message {index}" for index, what in reported_busters(request.messages))
    return RequestFingerprint(
        model=request.model,
        system=messages[0] if first.role == "system" else "",
        tools=tuple((tool.name, _tool_digest(tool)) for tool in request.tools),
        messages=messages,
        roles=tuple(_role(message) for message in request.messages),
        options=prompt_options(request),
        prompt_ids=tuple(prompt.token_ids),
        busters=busters,
    )


def prompt_options(request: ChatRequest) -> dict[str, str]:
    """The settings besides model, system, tools and messages that change the rendered prompt."""
    schema = request.response_format.schema if request.response_format else None
    return {"thinking": repr(request.thinking),
            "tool_choice": f"{request.tool_choice.mode}:{request.tool_choice.name or ''}",
            "response_format": _digest(schema) if schema is not None else ""}


def _message_digest(message: Message) -> str:
    kept = drop_billing_headers((message,))[0]
    if not kept:
        return ""
    data = dataclasses.asdict(kept[0])
    return _digest(data)


def _tool_digest(tool: FunctionTool) -> str:
    return _digest(dataclasses.asdict(tool))


def _role(message: Message) -> str:
    if message.role == "assistant" and message.tool_calls:
        return "assistant tool call"
    return "tool result" if message.role == "tool" else message.role


def _digest(data: object) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
