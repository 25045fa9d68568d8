"""Canonical messages ⇄ JSON, the form they are persisted in. Defaults are left out to keep rows small:

    {"role": "assistant", "content": "", "reasoning": "look first",
     "tool_calls": [{"id": "call_1", "name": "sh", "arguments": "{\"cmd\":\"ls\"}"}]}
    {"role": "tool", "content": "a.txt", "tool_call_id": "call_1", "name": "sh"}

The round trip is exact: `message_from_json(message_to_json(m)) == m` for every canonical `Message`.
"""

from __future__ import annotations

from collections.abc import Iterable

from zllm.canonical import Message, ToolCall


def message_to_json(message: Message) -> dict:
    data: dict = {"role": message.role}
    if message.content:
        data["content"] = message.content
    if message.tool_calls:
        data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    for key in ("tool_call_id", "name", "reasoning"):
        value = getattr(message, key)
        if value is not None:
            data[key] = value
    return data


def message_from_json(data: dict) -> Message:
    return Message(
        role=data["role"],
        content=data.get("content", ""),
        tool_calls=tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in data.get("tool_calls", ())),
        tool_call_id=data.get("tool_call_id"),
        name=data.get("name"),
        reasoning=data.get("reasoning"),
    )


def messages_to_json(messages: Iterable[Message]) -> list[dict]:
    return [message_to_json(m) for m in messages]


def messages_from_json(items: Iterable[dict]) -> tuple[Message, ...]:
    return tuple(message_from_json(item) for item in items)
