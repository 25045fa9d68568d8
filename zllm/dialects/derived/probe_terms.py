"""What every probe conversation is made of (probe.py): the sentinels no template writes by itself, the probe
tools, a call as the probes give it, and the failure a probe raises."""

from __future__ import annotations

import json
from dataclasses import replace as _dataclass_replace

from zllm.dialects.derived.format import CallFormat

USER = "zq-user"
USER_NEXT = "zq-user-next"
TEXT = "zq-text"
THINK = "zq-think"
NAME_A, NAME_B = "zqa", "zqb"
K1, K2, KN = "zqk1", "zqk2", "zqkn"
V1, V2, VN = "zq-v1", "zq-v2", 7

# each parameter described: Command R+'s template reads every parameter's description
PROBE_TOOLS = [
    {"type": "function", "function": {"name": NAME_A, "description": "probe a", "parameters": {
        "type": "object", "properties": {K1: {"type": "string", "description": "probe k1"},
                                         K2: {"type": "string", "description": "probe k2"}}, "required": [K1]}}},
    {"type": "function", "function": {"name": NAME_B, "description": "probe b", "parameters": {
        "type": "object", "properties": {KN: {"type": "integer", "description": "probe kn"}}, "required": [KN]}}},
]


class NotDerivable(ValueError):
    """The template's calls cannot be described (or do not come back the same way): the reason, in words."""


class NotExtended(NotDerivable):
    """A turn the template renders does not start with its generation prompt (`_Prober._drops_reasoning`)."""


def call(name: str, arguments: dict, index: int = 0, call_id: str = "") -> dict:
    # nine letters and digits: the one id shape every template takes (Mistral's insist on it)
    return {"id": call_id or probe_id(index), "type": "function", "function": {"name": name, "arguments": arguments}}


def probe_id(index: int) -> str:
    return f"zqidaaaa{index}"


def as_text(messages: list[dict]) -> list[dict]:
    """The conversation with each call's arguments as their JSON text."""
    def call_as_text(tool_call: dict) -> dict:
        arguments = tool_call["function"]["arguments"]
        if isinstance(arguments, str):
            return tool_call
        return {**tool_call, "function": {**tool_call["function"], "arguments": json_text(arguments)}}

    return [{**m, "tool_calls": [call_as_text(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages]


def json_text(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def find(text: str, needle: str, start: int = 0) -> int:
    at = text.find(str(needle), start)
    if at == -1:
        raise NotDerivable(f"{needle!r} is missing where the probe expects it")
    return at


def changed(fmt: CallFormat, **changes) -> CallFormat:
    return _dataclass_replace(fmt, **changes)
