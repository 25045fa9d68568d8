"""explain-miss --between: constructed near misses of each cause, rendered by the tiny Qwen model's renderer,
asserting the segment of B the divergence falls in and the cause named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.unit.inspect.tiny_store import TINY
from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.inspect import Cause, explain_between, explain_between_files
from zllm.prompt import PromptRenderer

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
BASH = FunctionTool("Bash", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"}}})
READ = FunctionTool("Read", "Read a file.", SCHEMA)
GREP = FunctionTool("Grep", "Search files.", {"type": "object", "properties": {"pattern": {"type": "string"}}})
SYSTEM = "You are a careful coding agent.\nWork in /repo.\nAnswer briefly."
CALL = ToolCall("call_1", "Read", '{"path": "a.json", "lines": 20}')
RESULT = '{"name": "café", "size": 12}'


def request(system: str = SYSTEM, tools: tuple[FunctionTool, ...] = (BASH, READ, GREP), *, ask: str = "Show a.json.",
            call: ToolCall = CALL, result: str = RESULT, model: str = "m") -> ChatRequest:
    return ChatRequest(id="r", model=model, tools=tools, messages=(
        Message("system", system),
        Message("user", ask),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", result, tool_call_id=call.id, name=call.name),
        Message("user", "Thanks. What next?"),
    ))


def explain(renderer, a: ChatRequest, b: ChatRequest, **kwargs):
    expl = explain_between(a, b, renderer, **kwargs)
    return expl.segment, expl.cause


def test_a_changed_tool_schema_is_named_with_its_tool(renderer) -> None:
    read = dataclasses.replace(READ, parameters={**SCHEMA, "properties": {"path": {"type": "string"},
                                                                         "offset": {"type": "integer"}}})
    expl = explain_between(request(), request(tools=(BASH, read, GREP)), renderer)
    assert (expl.segment, expl.cause) == ("tool 1 (Read)", Cause.CHANGED_TOOL_SCHEMA)
    assert "properties.offset" in expl.detail
    described = dataclasses.replace(GREP, description="Search files fast.")
    assert explain(renderer, request(), request(tools=(BASH, READ, described))) == (
        "tool 2 (Grep)", Cause.CHANGED_TOOL_SCHEMA)


def test_reordered_tools(renderer) -> None:
    expl = explain_between(request(), request(tools=(READ, BASH, GREP)), renderer)
    assert (expl.segment, expl.cause) == ("tool 0 (Read)", Cause.REORDERED_TOOLS)
    assert "tool 0 is Read (was Bash)" in expl.detail
    assert expl.cached_after.startswith("Bash") and expl.request_after.startswith("Read")


def test_added_tools(renderer) -> None:
    assert explain(renderer, request(tools=(BASH, READ)), request()) == ("tool 2 (Grep)", Cause.TOOLS_ADDED_OR_REMOVED)


def test_a_timestamp_in_the_system_prompt(renderer) -> None:
    a = request(system=SYSTEM + "\nCurrent time: 2025-06-01 10:00:00 UTC")
    b = request(system=SYSTEM + "\nCurrent time: 2025-06-01 10:05:00 UTC")
    expl = explain_between(a, b, renderer)
    assert (expl.segment, expl.cause) == ("system block", Cause.TIMESTAMP)
    assert "`2025-06-01 10:00:00 UTC` became `2025-06-01 10:05:00 UTC`" in expl.detail
    weekday = (request(system="Today is Monday.\n" + SYSTEM), request(system="Today is Tuesday.\n" + SYSTEM))
    assert explain(renderer, *weekday) == ("system block", Cause.TIMESTAMP)


@pytest.mark.parametrize(("old", "new"), [
    ("Session: 3f2b8c1e-9a7d-4e21-b0c4-5d6e7f8a9b0c", "Session: 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),
    ("session_id: s-20250601-a", "session_id: s-20250601-b"),
    ("Workspace token abc123def456ghi789", "Workspace token zyx987wvu654tsr321"),
])
def test_a_per_session_stamp_in_the_system_prompt(renderer, old: str, new: str) -> None:
    a, b = request(system=SYSTEM + "\n" + old), request(system=SYSTEM + "\n" + new)
    assert explain(renderer, a, b) == ("system block", Cause.SESSION_STAMP)


def test_a_billing_header_on_any_line_of_the_system_prompt_is_normalized_away(renderer) -> None:
    a = request(system=SYSTEM + "\nx-anthropic-billing-header: cc_version=2.1.332.0b8; cch=1a2b3;")
    b = request(system=SYSTEM + "\nx-anthropic-billing-header: cc_version=2.1.332.0c1; cch=9f8e7;")
    expl = explain_between(a, b, renderer)
    assert (expl.divergence, expl.cause) == (None, Cause.NO_MISS)


def test_a_whitespace_change(renderer) -> None:
    a, b = request(ask="Show a.json, please."), request(ask="Show a.json,  please.")
    expl = explain_between(a, b, renderer)
    assert (expl.segment, expl.cause) == ("message 1 (user)", Cause.WHITESPACE)
    trailing = request(system=SYSTEM + "\n"), request(system=SYSTEM)
    assert explain(renderer, *trailing) == ("system block", Cause.WHITESPACE)


def test_json_spelled_differently(renderer) -> None:
    reordered = dataclasses.replace(READ, parameters={"required": ["path"], "properties": SCHEMA["properties"],
                                                      "type": "object"})
    assert explain(renderer, request(), request(tools=(BASH, reordered, GREP))) == (
        "tool 1 (Read)", Cause.JSON_SERIALIZATION)
    call = dataclasses.replace(CALL, arguments='{"lines": 20, "path": "a.json"}')
    assert explain(renderer, request(), request(call=call)) == (
        "message 2 (assistant tool call)", Cause.JSON_SERIALIZATION)
    escaped = request(result='{"name": "caf\\u00e9", "size": 12}')
    assert explain(renderer, request(), escaped) == ("message 3 (tool result)", Cause.JSON_SERIALIZATION)
    compact = request(result='{"name":"café","size":12}')
    assert explain(renderer, request(), compact) == ("message 3 (tool result)", Cause.JSON_SERIALIZATION)


class TemplateSwap:
    """The same tokenizer with another chat template (a deep copy of a 151K-token tokenizer takes seconds)."""

    def __init__(self, tokenizer, chat_template: str):
        self._tokenizer, self.chat_template = tokenizer, chat_template

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def apply_chat_template(self, messages, **kwargs):
        return self._tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)


def test_a_template_change(renderer) -> None:
    template = renderer.tokenizer.chat_template
    changed = template.replace("'<|im_end|>' + '\\n'", "'<|im_end|>' + '\\n\\n'")
    assert changed != template
    renderer_b = PromptRenderer(TemplateSwap(renderer.tokenizer, changed))
    expl = explain_between(request(), request(), renderer, renderer_b=renderer_b)
    assert expl.cause is Cause.TEMPLATE_CHANGE and expl.segment == "message 1 (user)"
    assert "same canonical request" in expl.detail


def test_a_different_model_or_namespace(renderer) -> None:
    expl = explain_between(request(model="qwen3-8b"), request(model="qwen3-14b"), renderer)
    assert (expl.divergence, expl.segment, expl.cause) == (None, None, Cause.DIFFERENT_MODEL)
    expl = explain_between(request(), request(), renderer, namespace_a="k1", namespace_b="k2")
    assert expl.cause is Cause.DIFFERENT_NAMESPACE


def test_edited_history(renderer) -> None:
    assert explain(renderer, request(ask="Show a.json."), request(ask="Delete everything.")) == (
        "message 1 (user)", Cause.EDITED_HISTORY)


def test_no_miss_when_one_prompt_extends_the_other(renderer) -> None:
    a = request()
    b = dataclasses.replace(a, messages=a.messages + (Message("assistant", "Nothing."), Message("user", "OK.")))
    expl = explain_between(a, b, renderer)
    assert (expl.cause, expl.divergence) == (Cause.NO_MISS, None) and "prefix of the request" in expl.detail
    assert explain_between(a, a, renderer).cause is Cause.NO_MISS


def test_files_are_decoded_in_their_own_formats_and_compared(tmp_path: Path, tiny_env: Path) -> None:
    system = "You are terse.\nCurrent time: 2025-06-01 10:00:00 UTC"
    a = {"model": TINY, "max_tokens": 64, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    b = {"model": TINY, "messages": [{"role": "developer", "content": system.replace("10:00", "10:07")},
                                     {"role": "user", "content": "hi"}]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    expl = explain_between_files(tmp_path / "a.json", tmp_path / "b.json", model=TINY)
    assert (expl.segment, expl.cause) == ("system block", Cause.TIMESTAMP)
    (tmp_path / "c.json").write_text(json.dumps({**a, "model": "another-model"}))
    assert explain_between_files(tmp_path / "a.json", tmp_path / "c.json", model=TINY).cause is Cause.DIFFERENT_MODEL
