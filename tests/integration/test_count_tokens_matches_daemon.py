"""`zllm count-tokens FILE` (offline, no daemon) counts exactly the prompt tokens a real daemon reports for the
same file's bytes, in all three formats: usage.prompt_tokens (Chat), usage.input_tokens (Responses), the
input + cache tokens of Anthropic usage, and Anthropic's count_tokens endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.integration.conftest import CONTEXT, TINY
from tests.support.http_client import post_raw
from zllm.cli import count_tokens

SCHEMA = {"type": "object", "properties": {"p": {"type": "string"}}}
# one short tool round trip per format; with the tool preamble it stays inside the 192-token window
BODIES = {
    "chat": ("/v1/chat/completions", {
        "model": TINY, "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "ls?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "a"}],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": SCHEMA}}]}),
    "responses": ("/v1/responses", {
        "model": TINY, "max_output_tokens": 16, "temperature": 0, "store": False, "instructions": "Be terse.",
        "input": [{"type": "message", "role": "user", "content": "ls?"},
                  {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"p": "."}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "a"}],
        "tools": [{"type": "function", "name": "ls", "parameters": SCHEMA}]}),
    "anthropic": ("/v1/messages", {
        "model": TINY, "max_tokens": 1, "temperature": 0,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
                   {"type": "text", "text": "Be terse."}],
        "messages": [{"role": "user", "content": "ls?"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ls",
                                                        "input": {"p": "."}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a"}]}],
        "tools": [{"name": "ls", "input_schema": SCHEMA}]}),
}


def offline_count(path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("ZLLM_DATA_DIR", str(data_dir))
    app = typer.Typer()
    app.callback()(lambda: None)
    count_tokens.register(app)
    result = CliRunner().invoke(app, ["count-tokens", str(path), "--model", TINY, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def daemon_prompt_tokens(daemon, route: str, body: bytes) -> int:
    status, answer = post_raw(daemon.base_url, route, body, {"Authorization": "Bearer test-key"})
    assert status == 200, answer
    usage = answer["usage"]
    if "prompt_tokens" in usage:
        return usage["prompt_tokens"]
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)


@pytest.mark.parametrize("fmt", sorted(BODIES))
def test_count_tokens_equals_the_daemons_prompt_tokens(fmt: str, daemon, tiny_data_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    route, body = BODIES[fmt]
    path = tmp_path / f"{fmt}.json"
    path.write_bytes(json.dumps(body).encode())
    counted = offline_count(path, tiny_data_dir, monkeypatch)
    assert counted["format"] == fmt and counted["tools"] > 0 and counted["total"] < CONTEXT
    assert daemon_prompt_tokens(daemon, route, path.read_bytes()) == counted["total"]
    if fmt == "anthropic":
        status, answer = post_raw(daemon.base_url, "/v1/messages/count_tokens", path.read_bytes(),
                                  {"Authorization": "Bearer test-key"})
        assert (status, answer) == (200, {"input_tokens": counted["total"]})


def test_the_three_formats_of_one_conversation_count_alike(tiny_data_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    totals = set()
    for fmt, (_, body) in BODIES.items():
        path = tmp_path / f"{fmt}.json"
        path.write_text(json.dumps(body))
        totals.add(offline_count(path, tiny_data_dir, monkeypatch)["total"])
    assert len(totals) == 1
