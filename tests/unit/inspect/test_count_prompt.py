"""count-tokens: the total is the renderer's prompt length, and the breakdown adds up to it, for every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.inspect.tiny_store import TINY, TINY_WINDOW
from zllm.errors import ContextLengthExceeded, ModelNotFound
from zllm.inspect import (
    count_prompt,
    count_tokens_file,
    format_count,
    read_request_file,
)

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
SAME_CONVERSATION = {  # one conversation in the three wire formats
    "chat": {"model": "m", "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is in /tmp?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "/tmp"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "user", "content": "Thanks."}],
        "tools": [{"type": "function", "function": {"name": "ls", "description": "List.", "parameters": SCHEMA}}]},
    "responses": {"model": "m", "instructions": "Be terse.", "input": [
        {"type": "message", "role": "user", "content": "What is in /tmp?"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"path": "/tmp"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "message", "role": "user", "content": "Thanks."}],
        "tools": [{"type": "function", "name": "ls", "description": "List.", "parameters": SCHEMA}]},
    "anthropic": {"model": "m", "max_tokens": 64, "system": "Be terse.", "messages": [
        {"role": "user", "content": "What is in /tmp?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ls", "input": {"path": "/tmp"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a.txt"},
                                     {"type": "text", "text": "Thanks."}]}],
        "tools": [{"name": "ls", "description": "List.", "input_schema": SCHEMA}]},
}


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, body in SAME_CONVERSATION.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(body))
    return paths


def test_the_breakdown_adds_up_to_the_rendered_prompt(renderer, files: dict[str, Path]) -> None:
    request = read_request_file(files["chat"]).request
    count = count_prompt(renderer, request)
    assert count.total == len(renderer.render(request).token_ids)
    assert sum(s.tokens for s in count.segments) == count.total
    assert [s.label.name for s in count.segments] == [
        "system block", "tool 0 (ls)", "message 1 (user)", "message 2 (assistant tool call)",
        "message 3 (tool result)", "message 4 (user)", "generation prompt"]
    assert all(s.tokens > 0 for s in count.segments)


def test_the_three_formats_of_one_conversation_count_the_same(renderer, files: dict[str, Path]) -> None:
    counts = {name: count_prompt(renderer, read_request_file(path).request) for name, path in files.items()}
    assert len({c.total for c in counts.values()}) == 1
    assert len({tuple((s.label.name, s.tokens) for s in c.segments) for c in counts.values()}) == 1


def test_count_tokens_file_uses_the_stored_model(tiny_env: Path, files: dict[str, Path], renderer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    count = count_tokens_file(files["anthropic"], model=TINY)
    assert (count.model, count.context_length) == (TINY, TINY_WINDOW)
    assert count.total == count_prompt(renderer, read_request_file(files["chat"]).request).total
    data = count.to_json()
    assert data["format"] == "anthropic" and data["total"] == count.total
    assert data["system"] + data["tools"] + data["messages"] + data["generation_prompt"] == count.total
    assert data["tools"] == next(s["tokens"] for s in data["segments"] if s["name"] == "tool 0 (ls)")
    monkeypatch.setenv("ZLLM_CONTEXT_LENGTH", "100")  # the served window wins over the model's own
    assert count_tokens_file(files["chat"], model=TINY).context_length == 100


def test_a_model_that_is_not_pulled_says_how_to_pull_it(tiny_env: Path, files: dict[str, Path]) -> None:
    with pytest.raises(ModelNotFound) as caught:
        count_tokens_file(files["chat"], model="qwen3-8b")
    assert caught.value.hint == f"pull it first: zllm pull qwen3-8b (or pick one with --model: {TINY})"


def test_without_a_store_the_hint_says_pull_and_nothing_is_created(tmp_path: Path, files: dict[str, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZLLM_DATA_DIR", str(tmp_path / "fresh"))
    with pytest.raises(ModelNotFound) as caught:
        count_tokens_file(files["chat"], model="smollm2")
    assert caught.value.hint == "pull it first: zllm pull smollm2"
    assert not (tmp_path / "fresh").exists()


def test_the_text_groups_the_tools_and_flags_a_prompt_too_long(tiny_env: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    body = dict(SAME_CONVERSATION["chat"])
    body["tools"] = body["tools"] + [{"type": "function", "function": {"name": "cat", "parameters": SCHEMA}}]
    (tmp_path / "two.json").write_text(json.dumps(body))
    count = count_tokens_file(tmp_path / "two.json", model=TINY)
    lines = str(format_count(count)).splitlines()
    names = [line[:-8].rstrip() for line in lines[1:-1]]
    assert names[1:5] == ["  tools", "    tool instructions", "    tool 0 (ls)", "    tool 1 (cat)"]
    assert int(lines[2][-8:]) == sum(int(line[-8:]) for line in lines[3:6]) == count.to_json()["tools"]
    assert lines[-1].endswith(f"of a {TINY_WINDOW}-token window")
    monkeypatch.setenv("ZLLM_CONTEXT_LENGTH", str(count.total))  # no room left for an answer
    assert str(format_count(count_tokens_file(tmp_path / "two.json", model=TINY))).rstrip().endswith(": too long")


def test_a_prompt_its_length_proves_too_long_is_refused_not_counted(tiny_env: Path, tmp_path: Path) -> None:
    # counting it exactly would tokenize megabytes; the daemon's count_tokens refuses it the same way
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * (TINY_WINDOW * 128 * 4 // 5 + 1)}]}
    (tmp_path / "huge.json").write_text(json.dumps(body))
    with pytest.raises(ContextLengthExceeded, match=f"prompt is too long: at least \\d+ tokens > {TINY_WINDOW} max"):
        count_tokens_file(tmp_path / "huge.json", model=TINY)
