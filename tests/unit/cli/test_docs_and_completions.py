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
    assert {"serve", "start", "stop", "status", "pull", "ls", "rm", "ps", "cache", "trace", "config"} <= offered


def all_commands(command=None, path: tuple[str, ...] = ()):
    """(path, click command) for every leaf command: ("serve",), ..., ("cache", "prune")."""
    import typer.main

    command = command or typer.main.get_command(app)
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from all_commands(sub, (*path, name))
    else:
        yield path, command


def man_page() -> str:
    return (ROOT / "man" / "zllm.1").read_text().replace("\\-", "-")


def test_man_page_documents_every_command() -> None:
    page = man_page()
    names = [" ".join(path) for path, _ in all_commands()]
    assert {"serve", "start", "stop", "status", "logs", "ps", "trace", "config", "cache prune"} <= set(names)
    missing = [name for name in names if f".B {name}\n" not in page and f".BI {name} " not in page]
    assert not missing, f"commands without an entry in man/zllm.1: {missing}"


def test_man_page_documents_every_option() -> None:
    page = man_page()
    missing = [f"{' '.join(path)} {flag}" for path, command in all_commands()
               for param in command.params for flag in (*param.opts, *param.secondary_opts)
               if flag.startswith("--") and flag != "--help" and flag not in page]
    assert not missing, f"undocumented in man/zllm.1: {missing}"


def test_help_documents_the_exit_codes() -> None:
    result = subprocess.run([sys.executable, "-m", "zllm", "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert result.returncode == 0
    assert "Exit status: 0 ok, 1 a failure you can fix" in result.stdout and "3 no daemon answers" in result.stdout
