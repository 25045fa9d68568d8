"""`zllm count-tokens FILE`: (exit code, stdout, stderr) for a count, its JSON, and each user error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.unit.inspect.tiny_store import TINY, TINY_WINDOW, linked_store
from zllm.cli import count_tokens

BODY = {"model": "whatever", "max_tokens": 32000, "system": "Be terse.",
        "messages": [{"role": "user", "content": "List the files."}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]}


def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the verb keeps its name as in `zllm`
    count_tokens.register(app)
    return app


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return linked_store(tmp_path_factory.mktemp("zllm-data"))


@pytest.fixture()
def run(data_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZLLM_DATA_DIR", str(data_dir))
    monkeypatch.setenv("ZLLM_MODEL", TINY)
    monkeypatch.delenv("ZLLM_CONTEXT_LENGTH", raising=False)

    def invoke(*args: str):
        return CliRunner().invoke(cli(), ["count-tokens", *map(str, args)])
    return invoke


@pytest.fixture()
def prompt(tmp_path: Path) -> Path:
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(BODY))
    return path


def test_json_output_is_one_object_with_the_breakdown(run, prompt: Path) -> None:
    result = run(prompt, "--json")
    assert (result.exit_code, result.stderr) == (0, "")
    data = json.loads(result.stdout)
    assert (data["model"], data["format"], data["context_length"]) == (TINY, "anthropic", TINY_WINDOW)
    assert [s["name"] for s in data["segments"]] == ["system block", "tool 0 (Bash)", "message 1 (user)",
                                                     "generation prompt"]
    assert sum(s["tokens"] for s in data["segments"]) == data["total"] > 0


def test_text_output_lists_each_segment_then_the_total(run, prompt: Path) -> None:
    result = run(prompt)
    data = json.loads(run(prompt, "--json").stdout)
    assert (result.exit_code, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == f"{prompt} · Anthropic Messages (top-level `system`) · model {TINY}"
    tokens = {s["name"]: s["tokens"] for s in data["segments"]}
    assert [line[:-8].rstrip() for line in lines[1:-1]] == [
        "  system block", "  tools", "    tool 0 (Bash)", "  message 1 (user)", "  generation prompt"]
    assert [int(line[-8:]) for line in lines[1:-1]] == [
        tokens["system block"], data["tools"], tokens["tool 0 (Bash)"], tokens["message 1 (user)"],
        tokens["generation prompt"]]
    assert lines[-1].split()[:2] == ["total", str(data["total"])] and f"of a {TINY_WINDOW}-token window" in lines[-1]


def test_the_format_can_be_forced(run, prompt: Path, tmp_path: Path) -> None:
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
    assert json.loads(run(chat, "--json").stdout)["format"] == "anthropic"
    assert json.loads(run(chat, "--json", "--format", "chat").stdout)["format"] == "chat"


@pytest.mark.parametrize(("setup", "args", "error", "hint"), [
    (None, ["missing.json"], "error: no such file: ", "hint: pass the path of a JSON request body"),
    ("{nope", ["bad.json"], "error: ", "hint: the file must hold one JSON request body"),
    ('{"model": "m", "prompt": "hi"}', ["odd.json"], "no `messages` and no `input`", "hint: pass a request body"),
    (json.dumps(BODY), ["ok.json", "--format", "xml"], "error: unknown request format `xml`",
     "hint: use one of: chat, responses, anthropic"),
    (json.dumps(BODY), ["ok.json", "--model", "qwen3-8b"], "error: The model `qwen3-8b` does not exist.",
     "hint: pull it first: zllm pull qwen3-8b"),
    ('{"model": "m", "max_tokens": 9, "messages": [{"role": "robot", "content": "x"}]}', ["role.json"],
     "is not a valid Anthropic Messages request", "hint: "),
])
def test_user_errors_are_one_error_and_one_hint_with_exit_code_1(run, tmp_path: Path, setup: str | None,
                                                                 args: list[str], error: str, hint: str) -> None:
    if setup is not None:
        (tmp_path / args[0]).write_text(setup)
    result = run(tmp_path / args[0], *args[1:])
    stderr = " ".join(result.stderr.split())  # rich wraps long lines on stderr
    assert (result.exit_code, result.stdout) == (1, "")
    assert error in stderr and hint in stderr
    assert "Traceback" not in stderr
