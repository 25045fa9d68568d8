"""Anthropic Messages request JSON → canonical `ChatRequest` (for generation and for count_tokens).

    POST /v1/messages?beta=true
    {"model": "tiny-qwen", "max_tokens": 32000, "stream": true,
     "system": [{"type": "text", "text": "You are…", "cache_control": {"type": "ephemeral"}}],
     "messages": [{"role": "user", "content": "hi"}],
     "tools": [{"name": "Bash", "input_schema": {…}}], "tool_choice": {"type": "auto"},
     "stop_sequences": ["\\n\\nHuman:"], "temperature": 1, "top_p": 0.9, "top_k": 40,
     "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"},
     "context_management": {…}, "metadata": {"user_id": "{…}"}}

`max_tokens` is required, as Anthropic requires it; a value above the room left in the window is clamped by
the engine (Claude Code always asks for 32000), never rejected. `max_tokens: 0` is Anthropic's cache prewarm:
the prompt is prefilled into the prefix cache and the answer has no content, stop_reason "max_tokens" and the
usage split (canonical `prefill_only`). count_tokens bodies carry no `max_tokens`.
`thinking` (enabled / adaptive / disabled) becomes the canonical reasoning switch; a model family that
cannot reason ignores it. `context_management.edits` are decoded here and applied by the route, which needs
the engine to weigh the conversation (context_management.py, api/context_edits).
Validation errors are `InvalidRequest` naming the field; unknown fields and betas are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zllm.api.anthropic_messages.context_management import decode_context_management
from zllm.api.anthropic_messages.conversation import decode_conversation
from zllm.api.anthropic_messages.tools import (
    decode_tool_choice,
    decode_tools,
    forced_tool_name,
)
from zllm.api.fields import (
    check_type,
    decode_model,
    optional,
    required,
    sampling_fields,
)
from zllm.api.context_edits import ContextEdits
from zllm.api.output_options import thinking_from_anthropic
from zllm.canonical import ChatRequest, SamplingParams
from zllm.errors import InvalidRequest

API_NAME = "anthropic_messages"


@dataclass(frozen=True)
class MessagesCall:
    """A decoded request plus the wire option only the route cares about."""

    request: ChatRequest
    stream: bool
    # `context_management.edits` (None: the field was not sent, and the answer carries no context_management)
    edits: ContextEdits | None = None


def decode_messages_request(body: dict, *, request_id: str, namespace: str) -> MessagesCall:
    max_tokens = required(body, "max_tokens", "integer")
    if max_tokens < 0:
        raise InvalidRequest(f"`max_tokens` must be at least 0 (0 only fills the prompt cache), got {max_tokens}",
                             param="max_tokens")
    request = _decode_request(body, request_id=request_id, namespace=namespace, max_tokens=max_tokens or None)
    if max_tokens == 0:  # a prewarm: the sampling budget is unused
        request = replace(request, prefill_only=True)
    return MessagesCall(request=request, stream=bool(optional(body, "stream", "boolean")),
                        edits=decode_context_management(body))


def decode_count_tokens_request(body: dict, *, request_id: str, namespace: str) -> ChatRequest:
    """The request whose prompt count_tokens measures: the same decoding as generation, minus max_tokens."""
    return _decode_request(body, request_id=request_id, namespace=namespace, max_tokens=None)


def _decode_request(body: dict, *, request_id: str, namespace: str, max_tokens: int | None) -> ChatRequest:
    model = decode_model(body)
    thinking = thinking_from_anthropic(body)
    conversation = decode_conversation(body, model)
    loaded = set(conversation.referenced_tools)
    forced = forced_tool_name(body.get("tool_choice"))
    if forced:
        loaded.add(forced)
    tools = decode_tools(body.get("tools"), loaded=loaded)
    return ChatRequest(
        id=request_id,
        model=model,
        messages=tuple(conversation.messages),
        sampling=_decode_sampling(body, max_tokens),
        tools=tools,
        tool_choice=decode_tool_choice(body.get("tool_choice"), has_tools=bool(tools)),
        namespace=namespace,
        api=API_NAME,
        thinking=thinking,
    )


def _decode_sampling(body: dict, max_tokens: int | None) -> SamplingParams:
    return SamplingParams(
        **sampling_fields(body, "temperature", "top_p", "top_k"),
        max_tokens=max_tokens,
        stop=_decode_stop_sequences(body.get("stop_sequences")),
    )


def _decode_stop_sequences(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = check_type(raw, "array", "stop_sequences")
    stops = tuple(check_type(item, "string", f"stop_sequences[{i}]") for i, item in enumerate(items))
    if any(not stop for stop in stops):
        raise InvalidRequest("`stop_sequences` must be non-empty strings", param="stop_sequences")
    return stops
