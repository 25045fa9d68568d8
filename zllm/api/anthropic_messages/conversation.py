"""Anthropic `system` + `messages` → the canonical conversation (a tuple of `Message`s).

    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=…;"},      ← dropped later
               {"type": "text", "text": "You are…", "cache_control": {"type": "ephemeral"}}]
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "<system-reminder>…"}, {"type": "text", "text": "hi"}]},
      {"role": "system", "content": "# Environment …"},
      {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "…", "signature": "zllm1.…"},
          {"type": "text", "text": "Let me look."},
          {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
      {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": false}]}]
  →
    system "x-anthropic-billing-header: …\nYou are…" (the renderer drops that line)
    · user "<system-reminder>…\nhi" · system "# Environment …"
    · assistant "Let me look." (reasoning "…", tool_calls [toolu_1 Bash {"command":"ls"}])
    · tool "a.txt" (toolu_1, Bash)

One wire message may become several canonical ones: a user message's tool_result blocks become `tool`
messages and its text blocks (between them) user messages, in block order. Consecutive same-role messages
are kept, not merged, exactly as OpenAI Chat keeps them: the chat template decides how they render.
`tool_use.input` becomes `ToolCall.arguments` as compact JSON (`separators=(",", ":")`, non-ASCII kept),
the form OpenAI Chat decoding gives a parsed-object `arguments`; templates re-serialize it anyway.
Thinking blocks become the assistant's `reasoning` only when we signed them (signature.py); foreign ones and
`redacted_thinking` are dropped. A `compaction` block (the summary a compact_20260112 edit wrote) drops every
message and block before it: the conversation restarts from the system prompt and the summary. An errored tool result reads "Error: …"; a `tool_reference` block reads
"Tool loaded: NAME" and loads that deferred tool (tools.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from zllm.api.anthropic_messages import wire
from zllm.api.anthropic_messages.signature import is_own_thinking
from zllm.api.fields import check_type, json_type_name, optional, required
from zllm.api.summary import summary_message
from zllm.canonical import Message, ToolCall
from zllm.errors import InvalidRequest


@dataclass
class Conversation:
    """The decoded conversation, plus what tool decoding needs from it."""

    model: str  # thinking signatures are checked against it
    messages: list[Message] = field(default_factory=list)
    # tool_use id → tool name, so tool results carry the name for templates that render it
    call_names: dict[str, str] = field(default_factory=dict)
    # tools named by tool_reference blocks: deferred tools that the conversation has loaded
    referenced_tools: set[str] = field(default_factory=set)
    # the newest compaction block: (index its assistant message gets in `messages`, the summary)
    compaction: tuple[int, str] | None = None


def decode_conversation(body: dict, model: str) -> Conversation:
    conversation = Conversation(model=model)
    system = _decode_system(body.get("system"))
    if system is not None:
        conversation.messages.append(Message(role="system", content=system))
    items = required(body, "messages", "array")
    if not items:
        raise InvalidRequest("`messages` must not be empty", param="messages")
    for i, item in enumerate(items):
        _decode_message(item, f"messages[{i}]", conversation)
    if conversation.compaction is not None:
        _drop_compacted(conversation, system_messages=0 if system is None else 1)
    return conversation


def _drop_compacted(conversation: Conversation, *, system_messages: int) -> None:
    """Everything before the newest compaction block goes, as Anthropic drops it: the system prompt, the summary
    (as the Responses compaction shows it: api/summary.py), then what followed the block."""
    at, summary = conversation.compaction
    rest = conversation.messages[at:]
    if rest and rest[0].role == "assistant" and not (rest[0].content or rest[0].tool_calls or rest[0].reasoning):
        rest = rest[1:]  # the block was all that message said (a paused compaction)
    conversation.messages[:] = [*conversation.messages[:system_messages], summary_message(summary), *rest]


def _decode_system(raw: object) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw or None
    blocks = _blocks(raw, "system")
    texts = [_text_block(block, f"system[{j}]") for j, block in enumerate(blocks)]
    # the billing header block stays: the renderer drops it (and the trace reports it) on every API path
    return wire.BLOCK_SEPARATOR.join(texts) if texts else None


def _decode_message(item: object, param: str, conversation: Conversation) -> None:
    item = check_type(item, "object", param)
    wire_role = required(item, "role", "string", f"{param}.role")
    role = wire.ROLES.get(wire_role)
    if role is None:
        raise InvalidRequest(f"`{param}.role` must be user, assistant or system; got {wire_role!r}",
                             param=f"{param}.role")
    if item.get("content") is None:
        raise InvalidRequest(f"missing required parameter `{param}.content`", param=f"{param}.content")
    blocks = _blocks(item["content"], f"{param}.content")
    if role == "assistant":
        conversation.messages.append(_decode_assistant(blocks, f"{param}.content", conversation))
    elif role == "user":
        conversation.messages.extend(_decode_user(blocks, f"{param}.content", conversation))
    else:
        texts = [_text_block(block, f"{param}.content[{j}]") for j, block in enumerate(blocks)]
        conversation.messages.append(Message(role="system", content=wire.BLOCK_SEPARATOR.join(texts)))


def _blocks(content: object, param: str) -> list[dict]:
    """Content as a list of block objects; a bare string is one text block."""
    if isinstance(content, str):
        return [{"type": wire.TEXT, "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(
            f"`{param}` must be a string or an array of content blocks, got {json_type_name(content)}", param=param
        )
    return [check_type(block, "object", f"{param}[{j}]") for j, block in enumerate(content)]


# ----------------------------------------------------------------------------------------------------------
# user


def _decode_user(blocks: list[dict], param: str, conversation: Conversation) -> list[Message]:
    messages: list[Message] = []
    texts: list[str] = []

    def flush_text() -> None:
        if texts:
            messages.append(Message(role="user", content=wire.BLOCK_SEPARATOR.join(texts)))
            texts.clear()

    for j, block in enumerate(blocks):
        block_param = f"{param}[{j}]"
        kind = _block_type(block, block_param)
        if kind == wire.TEXT:
            texts.append(_text_block(block, block_param))
        elif kind == wire.TOOL_RESULT:
            flush_text()
            messages.append(_decode_tool_result(block, block_param, conversation))
        else:
            raise _unsupported_block(kind, block_param, "user")
    flush_text()
    return messages or [Message(role="user", content="")]


def _decode_tool_result(block: dict, param: str, conversation: Conversation) -> Message:
    call_id = required(block, "tool_use_id", "string", f"{param}.tool_use_id")
    content = _tool_result_text(block.get("content"), f"{param}.content", conversation)
    if optional(block, "is_error", "boolean", f"{param}.is_error"):
        content = f"{wire.TOOL_ERROR_LABEL}: {content}" if content else wire.TOOL_ERROR_LABEL
    return Message(role="tool", content=content, tool_call_id=call_id, name=conversation.call_names.get(call_id))


def _tool_result_text(content: object, param: str, conversation: Conversation) -> str:
    if content is None:
        return ""
    parts = []
    for j, block in enumerate(_blocks(content, param)):
        block_param = f"{param}[{j}]"
        kind = _block_type(block, block_param)
        if kind == wire.TEXT:
            parts.append(_text_block(block, block_param))
        elif kind == wire.TOOL_REFERENCE:
            name = required(block, "tool_name", "string", f"{block_param}.tool_name")
            conversation.referenced_tools.add(name)
            parts.append(f"Tool loaded: {name}")
        else:
            raise _unsupported_block(kind, block_param, "tool_result")
    return wire.BLOCK_SEPARATOR.join(parts)


# ----------------------------------------------------------------------------------------------------------
# assistant


def _decode_assistant(blocks: list[dict], param: str, conversation: Conversation) -> Message:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        block_param = f"{param}[{j}]"
        kind = _block_type(block, block_param)
        if kind == wire.TEXT:
            texts.append(_text_block(block, block_param))
        elif kind == wire.COMPACTION:
            summary = optional(block, "content", "string", f"{block_param}.content")
            if summary is not None:  # null content: a compaction that failed, a no-op
                for dropped in (texts, reasoning, calls):  # what came before the summary goes
                    dropped.clear()
                conversation.compaction = (len(conversation.messages), summary)
        elif kind == wire.THINKING:
            reasoning.extend(_own_thinking(block, block_param, conversation.model))
        elif kind == wire.TOOL_USE:
            calls.append(_decode_tool_use(block, block_param))
        elif kind != wire.REDACTED_THINKING:  # opaque data from another server: nothing we can render
            raise _unsupported_block(kind, block_param, "assistant")
    conversation.call_names.update((call.id, call.name) for call in calls)
    return Message(
        role="assistant",
        content=wire.ASSISTANT_SEPARATOR.join(texts),
        tool_calls=tuple(calls),
        reasoning=wire.ASSISTANT_SEPARATOR.join(reasoning) or None,
    )


def _own_thinking(block: dict, param: str, model: str) -> list[str]:
    """The block's text if we signed it (see signature.py); a foreign or unsigned block is dropped."""
    thinking = optional(block, "thinking", "string", f"{param}.thinking") or ""
    signature = optional(block, "signature", "string", f"{param}.signature") or ""
    return [thinking] if thinking and is_own_thinking(model, thinking, signature) else []


def _decode_tool_use(block: dict, param: str) -> ToolCall:
    call_id = required(block, "id", "string", f"{param}.id")
    name = required(block, "name", "string", f"{param}.name")
    tool_input = optional(block, "input", "object", f"{param}.input") or {}
    return ToolCall(id=call_id, name=name, arguments=json.dumps(tool_input, ensure_ascii=False, separators=(",", ":")))


# ----------------------------------------------------------------------------------------------------------
# blocks


def _block_type(block: dict, param: str) -> str:
    return required(block, "type", "string", f"{param}.type")


def _text_block(block: dict, param: str) -> str:
    kind = _block_type(block, param)
    if kind != wire.TEXT:
        raise _unsupported_block(kind, param, "text-only")
    return required(block, "text", "string", f"{param}.text")


def _unsupported_block(kind: str, param: str, where: str) -> InvalidRequest:
    if kind in wire.UNSUPPORTED_BLOCKS:
        what = wire.UNSUPPORTED_BLOCKS[kind]
        return InvalidRequest(f"{what} content ({kind!r} blocks) is not supported: zllm serves text-only models "
                              "and runs no server tools", param=f"{param}.type")
    return InvalidRequest(f"content block type {kind!r} is not allowed in {where} content", param=f"{param}.type")
