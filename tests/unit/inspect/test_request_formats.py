"""Request files: the format is recognised from the body's keys (or forced), then decoded by that API's decoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zllm.canonical import Message
from zllm.inspect.formats import (
    RequestFileError,
    RequestFormat,
    detect_format,
    read_request_file,
)

CLAUDE_CODE = {  # the shape Claude Code sends (CLIENTS.md): system blocks, a system turn inside `messages`
    "model": "claude-opus-5-5", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                 {"role": "system", "content": "Today is Monday."}],
    "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}],
    "thinking": {"type": "adaptive"}, "metadata": {"user_id": "{}"},
}
CODEX = {  # Codex: no instructions, a developer message in `input`
    "model": "gpt-5.5", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
    "input": [{"type": "message", "id": "msg_1", "role": "developer",
               "content": [{"type": "input_text", "text": "You are Codex."}]},
              {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "tools": [{"type": "function", "name": "exec_command", "strict": False,
               "parameters": {"type": "object", "properties": {}}}],
}
OPENAI_CHAT = {
    "model": "m",
    "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object", "properties": {}}}}],
}


def write(tmp_path: Path, document: object, name: str = "prompt.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


@pytest.mark.parametrize(("body", "expected"), [
    (CLAUDE_CODE, RequestFormat.ANTHROPIC),
    (CODEX, RequestFormat.RESPONSES),
    (OPENAI_CHAT, RequestFormat.CHAT),
    ({"model": "m", "input": "hi"}, RequestFormat.RESPONSES),
    ({"model": "m", "instructions": "Be brief.", "input": []}, RequestFormat.RESPONSES),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, RequestFormat.CHAT),
    ({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}, RequestFormat.ANTHROPIC),
    ({"model": "m", "max_tokens": 16, "stream_options": {}, "messages": [{"role": "user", "content": "hi"}]},
     RequestFormat.CHAT),
    ({"model": "m", "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                    "input": {}}]}]}, RequestFormat.ANTHROPIC),
    ({"model": "m", "messages": [{"role": "tool", "tool_call_id": "c", "content": "x"}]}, RequestFormat.CHAT),
])
def test_format_is_recognised_from_the_keys(body: dict, expected: RequestFormat) -> None:
    assert detect_format(body)[0] is expected


def test_each_format_decodes_with_its_own_decoder(tmp_path: Path) -> None:
    claude = read_request_file(write(tmp_path, CLAUDE_CODE, "a.json"))
    assert (claude.format, claude.reason) == (RequestFormat.ANTHROPIC, "top-level `system`")
    # the billing block is kept for the renderer to drop (and report); the mid-conversation system turn is
    # kept in place
    assert claude.request.messages == (
        Message("system", "x-anthropic-billing-header: cc_version=2.1.332.0b8;\nYou are Claude Code."),
        Message("user", "hi"), Message("system", "Today is Monday."))
    codex = read_request_file(write(tmp_path, CODEX, "b.json"))
    assert codex.format is RequestFormat.RESPONSES
    assert [m.role for m in codex.request.messages] == ["system", "user"]
    assert [t.name for t in codex.request.tools] == ["exec_command"]
    chat = read_request_file(write(tmp_path, OPENAI_CHAT, "c.json"))
    assert chat.format is RequestFormat.CHAT and chat.request.messages[0] == Message("system", "Be brief.")


def test_a_captured_exchange_is_unwrapped_and_its_path_decides(tmp_path: Path) -> None:
    capture = {"method": "POST", "path": "/v1/messages", "query": "beta=true", "headers": {},
               "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    request_file = read_request_file(write(tmp_path, capture))
    assert (request_file.format, request_file.reason) == (RequestFormat.ANTHROPIC, "path /v1/messages")
    assert request_file.request.messages == (Message("user", "hi"),)


def test_format_can_be_forced(tmp_path: Path) -> None:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    forced = read_request_file(write(tmp_path, body), fmt="chat")
    assert (forced.format, forced.reason) == (RequestFormat.CHAT, "--format")
    assert forced.request.sampling.max_tokens == 16


@pytest.mark.parametrize(("content", "message", "hint"), [
    (None, "no such file", "JSON request body"),
    ("{not json", "is not valid JSON", "one JSON request body"),
    ("[1, 2]", "not a request object", "an object"),
    ('{"model": "m", "prompt": "hi"}', "no `messages` and no `input`", "--format"),
    ('{"model": "m", "messages": [], "input": "hi"}', "both `messages` and `input`", "--format"),
    ('{"model": "m", "input": "hi", "previous_response_id": "resp_1"}', "previous_response_id",
     "whole conversation"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "missing required parameter `model`", "--format"),
])
def test_unusable_files_fail_with_a_message_and_a_hint(tmp_path: Path, content: str | None, message: str,
                                                       hint: str) -> None:
    path = tmp_path / "prompt.json" if content is None else write(tmp_path, content)
    with pytest.raises(RequestFileError) as caught:
        read_request_file(path)
    assert message in caught.value.message and hint in (caught.value.hint or "")


def test_an_unknown_forced_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RequestFileError, match="unknown request format `xml`"):
        read_request_file(write(tmp_path, OPENAI_CHAT), fmt="xml")
