"""The shipped completion scripts and man page stay in step with the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer._completion_shared import get_completion_script

from zllm.cli.app import app

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_committed_completion_scripts_are_current(shell: str) -> None:
    expected = get_completion_script(prog_name="zllm", complete_var="_ZLLM_COMPLETE", shell=shell)
    assert (ROOT / "completions" / f"zllm.{shell}").read_text().strip() == expected.strip()


def test_bash_completion_offers_the_verbs() -> None:
    env = {**os.environ, "COMP_WORDS": "zllm ", "COMP_CWORD": "1", "_ZLLM_COMPLETE": "complete_bash"}
    result = subprocess.run([sys.executable, "-m", "zllm"], env=env, capture_output=True, text=True, timeout=60)
    offered = set(result.stdout.split())
    assert {"serve", "pull", "ls", "rm"} <= offered


def test_man_page_documents_every_verb() -> None:
    page = (ROOT / "man" / "zllm.1").read_text()
    verbs = [command.name or command.callback.__name__ for command in app.registered_commands]
    assert verbs and all(f".B {verb}" in page or f".BI {verb} " in page for verb in verbs)


def test_man_page_documents_every_serve_flag() -> None:
    import typer.main

    page = (ROOT / "man" / "zllm.1").read_text().replace("\\-", "-")
    serve = typer.main.get_command(app).commands["serve"]
    flags = [opt for param in serve.params for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")]
    missing = [flag for flag in flags if flag != "--help" and flag not in page]
    assert flags and not missing, f"undocumented in man/zllm.1: {missing}"
