"""uv-style output discipline: data to stdout, people-facing lines to stderr, `error:` / `hint:` prefixes."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from zllm.errors import ZllmError

# people read stderr; stdout stays clean for pipes and --json
err = Console(stderr=True, highlight=False, soft_wrap=True)  # no wrapping at 80 columns in pipes and logs
out = Console(highlight=False)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fail(message: str, *, hint: str | None = None, cause: str | None = None, code: int = 1) -> NoReturn:
    # messages carry paths and brackets of their own: escape them so rich does not eat them as markup
    err.print(f"[bold red]error[/]: {escape(message)}")
    if cause:
        err.print(f"  [bold]Caused by[/]: {escape(cause)}")
    if hint:
        err.print(f"[bold cyan]hint[/]: {escape(hint)}")
    raise typer.Exit(code)


def fail_with(exc: ZllmError) -> NoReturn:
    cause = str(exc.__cause__) if exc.__cause__ else None
    fail(exc.message, hint=exc.hint, cause=cause)
