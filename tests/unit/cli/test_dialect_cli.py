"""`zllm dialect`: a stored model, a directory, or a template file; human lines or one JSON object; no daemon,
and neither torch nor transformers imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.support.tiny_models import REPO_ROOT, tiny_qwen_dir
from tests.unit.inspect.tiny_store import TINY, linked_store
from zllm.cli import dialect

# a ChatML template that renders messages' content and nothing else: it writes no tool calls of its own
PLAIN_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)
    dialect.register(app)
    return app


@pytest.fixture()
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZLLM_DATA_DIR", str(linked_store(tmp_path / "data")))
    monkeypatch.delenv("ZLLM_DIALECT", raising=False)
    return lambda *args: CliRunner().invoke(cli(), ["dialect", *map(str, args)])


def test_a_stored_model_as_json(run) -> None:
    result = run(TINY, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {"dialect", "derived", "reason", "round_trip", "sample"} <= set(report)
    assert (report["dialect"], report["derived"], report["round_trip"], report["compared"]) == (
        "hermes", False, True, "tokens")
    assert report["sample"].startswith('<tool_call>\n{"name": "get_weather"')


def test_a_template_alone_and_with_a_tokenizer(run, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(PLAIN_CHATML)
    alone = json.loads(run("--template", template, "--json").stdout)
    assert (alone["round_trip"], alone["compared"]) == (True, "text")
    assert "writes no tool calls" in alone["reason"]
    counted = run("--template", template, "--tokenizer", tiny_qwen_dir(), "--dialect", "qwen3")
    assert counted.exit_code == 0, counted.output
    assert counted.stdout.splitlines()[:2] == [
        "dialect qwen3 (chosen by rule): set by configuration (dialect = qwen3); the chat template writes no tool "
        "calls (it never reads `tool_calls`): zllm writes them in qwen3's format",
        "round trip: holds (render → parse → render gives the same tokens)"]


def test_user_errors(run, tmp_path: Path) -> None:
    assert run().exit_code == 1
    assert run("nope").exit_code == 1
    assert run(TINY, "--template", tmp_path / "t.jinja").exit_code == 1
    assert run("--template", tmp_path / "missing.jinja").exit_code == 1


def test_it_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    code = ("import sys; from zllm.cli.app import main\n"
            "try: main(['dialect', sys.argv[1], '--json'])\n"
            "except SystemExit as e: assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "ZLLM_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code, str(tiny_qwen_dir())], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
