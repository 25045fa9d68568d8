"""Responses items → canonical messages (used for request `input` *and* for our own output, so a chained
turn and a client that echoes the items back see the same conversation).

    [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
     {"type": "message", "role": "user", "content": "ls?"},
     {"type": "reasoning", "summary": [{"type": "summary_text", "text": "use exec"}], "content": null,
      "encrypted_content": "zllm.r1.…"},
     {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
     {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
     {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch…"},
     {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "ok"}]},
     {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", …}]}]
  → system "Be brief." · user "ls?" · assistant(reasoning "use exec", tool_calls [exec_command, apply_patch])
    · tool(call_1) "a.txt" · tool(call_2) "ok"        + the additional tools, declared for the request

A `compaction` item (ours: see compaction_seal.py) becomes the user message holding its summary; a final
`compaction_trigger` item asks for this turn to write one (`DecodedInput.compaction_trigger`).

Consecutive reasoning / assistant message / call items form one assistant message (that is how one model
turn is written out). Item `id`s and `status` are ignored. Item types zllm has no use for (hosted tool
calls, …) are skipped with a log line.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field, replace

from zllm.api.fields import check_type, json_type_name, optional, required
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.compaction_seal import (
    COMPACTION,
    COMPACTION_SUMMARY,
    COMPACTION_TRIGGER,
    CompactionSeal,
)
from zllm.api.openai_responses.tools import custom_arguments, qualified_name
from zllm.canonical import Message, ToolCall
from zllm.errors import InvalidRequest

log = logging.getLogger("zllm.api")


@dataclass(frozen=True)
class DecodedInput:
    messages: tuple[Message, ...]
    # tools declared by `additional_tools` items: (tool JSON, param path)
    tools: tuple[tuple[dict, str], ...] = ()
    compaction_trigger: bool = False  # the last item was `compaction_trigger`: summarize, do not answer


def decode_input(raw: object, param: str = "input", *, seal: CompactionSeal | None = None) -> DecodedInput:
    """`seal` opens `compaction` items; without one they are refused."""
    if raw is None:
        return DecodedInput(())
    if isinstance(raw, str):
        return DecodedInput((Message("user", raw),))
    items = check_type(raw, "array", param)
    conversation = _Conversation(seal=seal)
    for i, item in enumerate(items):
        if conversation.compaction_trigger:
            raise InvalidRequest("a compaction_trigger item must be the last input item",
                                 param=f"{param}[{i - 1}]")
        conversation.add_item(check_type(item, "object", f"{param}[{i}]"), f"{param}[{i}]")
    return conversation.result()


def name_tool_results(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Tool results named after the call they answer (templates that render the name need it). Run over the
    whole conversation: the call may be in the stored history of a chain, the result in the new input."""
    names: dict[str, str] = {}
    named = []
    for message in messages:
        names.update((call.id, call.name) for call in message.tool_calls)
        if message.role == "tool" and message.name is None and message.tool_call_id in names:
            message = replace(message, name=names[message.tool_call_id])
        named.append(message)
    return tuple(named)


def encode_reasoning(text: str) -> str:
    return wire.ENCRYPTED_REASONING_PREFIX + base64.urlsafe_b64encode(text.encode()).decode()


def _decode_encrypted_reasoning(value: object) -> str | None:
    if not isinstance(value, str) or not value.startswith(wire.ENCRYPTED_REASONING_PREFIX):
        return None  # another server's (OpenAI's) ciphertext: not ours to read
    try:
        return base64.urlsafe_b64decode(value[len(wire.ENCRYPTED_REASONING_PREFIX):]).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


@dataclass
class _Conversation:
    seal: CompactionSeal | None = None
    compaction_trigger: bool = False
    messages: list[Message] = field(default_factory=list)
    tools: list[tuple[dict, str]] = field(default_factory=list)
    # the assistant turn being assembled from consecutive items
    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)

    def result(self) -> DecodedInput:
        self._flush_assistant()
        return DecodedInput(tuple(self.messages), tuple(self.tools), self.compaction_trigger)

    def add_item(self, item: dict, param: str) -> None:
        kind = optional(item, "type", "string", f"{param}.type") or (wire.MESSAGE if "role" in item else None)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, item, param)
        elif kind == wire.ITEM_REFERENCE:
            raise InvalidRequest("item_reference input items are not supported: send the item itself",
                                 param=f"{param}.type")
        elif kind is None:
            raise InvalidRequest(f"missing required parameter `{param}.type`", param=f"{param}.type")
        else:
            log.info("%s: skipping input item of type %r (no use for it in a local model)", param, kind)

    def _message(self, item: dict, param: str) -> None:
        wire_role = required(item, "role", "string", f"{param}.role")
        role = wire.ROLES.get(wire_role)
        if role is None:
            raise InvalidRequest(f"`{param}.role` must be one of {', '.join(wire.ROLES)}; got {wire_role!r}",
                                 param=f"{param}.role")
        text = _content_text(item.get("content"), f"{param}.content")
        if role == "assistant":
            if self.text or self.calls:
                self._flush_assistant()
            self.text.append(text)
        else:
            self._append(Message(role, text))

    def _reasoning(self, item: dict, param: str) -> None:
        if self.text or self.calls:
            self._flush_assistant()
        text = _decode_encrypted_reasoning(item.get("encrypted_content"))
        if text is None:
            parts = item.get("content") or item.get("summary") or []
            text = _parts_text(check_type(parts, "array", f"{param}.summary"), f"{param}.summary")
        if text:  # an empty summary (no reasoning shown, none kept) adds nothing to render
            self.reasoning.append(text)

    def _function_call(self, item: dict, param: str) -> None:
        arguments = optional(item, "arguments", "string", f"{param}.arguments") or "{}"
        self._call(item, param, arguments)

    def _custom_tool_call(self, item: dict, param: str) -> None:
        self._call(item, param, custom_arguments(required(item, "input", "string", f"{param}.input")))

    def _call(self, item: dict, param: str, arguments: str) -> None:
        name = required(item, "name", "string", f"{param}.name")
        namespace = optional(item, "namespace", "string", f"{param}.namespace")
        call = ToolCall(id=required(item, "call_id", "string", f"{param}.call_id"),
                        name=qualified_name(name, namespace), arguments=arguments)
        self.calls.append(call)

    def _call_output(self, item: dict, param: str) -> None:
        call_id = required(item, "call_id", "string", f"{param}.call_id")
        output = item.get("output")
        if isinstance(output, str):
            text = output
        else:
            text = _parts_text(check_type(output, "array", f"{param}.output"), f"{param}.output", tool_output=True)
        self._append(Message("tool", text, tool_call_id=call_id))

    def _additional_tools(self, item: dict, param: str) -> None:
        tools = required(item, "tools", "array", f"{param}.tools")
        self.tools.extend((tool, f"{param}.tools[{j}]") for j, tool in enumerate(tools))

    def _compaction(self, item: dict, param: str) -> None:
        if self.seal is None:
            raise InvalidRequest("a compaction item can be read only by the zllm daemon that made it",
                                 param=f"{param}.type")
        self._append(self.seal.expand(item.get("encrypted_content"), f"{param}.encrypted_content"))

    def _compaction_trigger(self, _item: dict, param: str) -> None:
        if self.seal is None:
            raise InvalidRequest("compaction is not available here", param=f"{param}.type")
        self._flush_assistant()
        self.compaction_trigger = True

    def _append(self, message: Message) -> None:
        self._flush_assistant()
        self.messages.append(message)

    def _flush_assistant(self) -> None:
        if not (self.reasoning or self.text or self.calls):
            return
        self.messages.append(Message(
            "assistant",
            wire.PART_SEPARATOR.join(self.text),
            tool_calls=tuple(self.calls),
            reasoning=wire.PART_SEPARATOR.join(self.reasoning) if self.reasoning else None,
        ))
        self.reasoning, self.text, self.calls = [], [], []


_HANDLERS = {
    wire.MESSAGE: _Conversation._message,
    wire.REASONING: _Conversation._reasoning,
    wire.FUNCTION_CALL: _Conversation._function_call,
    wire.CUSTOM_TOOL_CALL: _Conversation._custom_tool_call,
    wire.FUNCTION_CALL_OUTPUT: _Conversation._call_output,
    wire.CUSTOM_TOOL_CALL_OUTPUT: _Conversation._call_output,
    wire.ADDITIONAL_TOOLS: _Conversation._additional_tools,
    COMPACTION: _Conversation._compaction,
    COMPACTION_SUMMARY: _Conversation._compaction,  # Codex's older name for the same item
    COMPACTION_TRIGGER: _Conversation._compaction_trigger,
}


def _content_text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"`{param}` must be a string or an array of content parts, "
                             f"got {json_type_name(content)}", param=param)
    return _parts_text(content, param)


def _parts_text(parts: list, param: str, *, tool_output: bool = False) -> str:
    return wire.PART_SEPARATOR.join(
        text for j, part in enumerate(parts)
        if (text := _part_text(part, f"{param}[{j}]", tool_output)) is not None
    )


def _part_text(part: object, param: str, tool_output: bool) -> str | None:
    part = check_type(part, "object", param)
    kind = required(part, "type", "string", f"{param}.type")
    if kind in wire.TEXT_PARTS:
        return required(part, "text", "string", f"{param}.text")
    if kind == wire.REFUSAL_PART:
        return required(part, "refusal", "string", f"{param}.refusal")
    if kind in wire.UNSUPPORTED_PARTS and tool_output:
        # a tool (Codex's view_image) returned media: failing would end the agent's whole session
        log.info("%s: a tool returned %s content; the text-only model sees a placeholder", param, kind)
        return f"[{wire.UNSUPPORTED_PARTS[kind]} omitted: this model reads text only]"
    if kind in wire.UNSUPPORTED_PARTS:
        raise InvalidRequest(f"{wire.UNSUPPORTED_PARTS[kind]} content ({kind!r} parts) is not supported: "
                             "zllm serves text-only models", param=f"{param}.type")
    raise InvalidRequest(f"unknown content part type {kind!r}", param=f"{param}.type")
