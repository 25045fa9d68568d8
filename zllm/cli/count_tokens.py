"""`zllm count-tokens FILE`: the prompt tokens a request file costs on a model, and where they go.

No daemon needed: the file is decoded and rendered here with the model's own tokenizer (the store's copy),
exactly as the daemon renders it. stdout gets the breakdown (or one JSON object with `--json`); errors go to
stderr as `error:` / `hint:` with exit code 1.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zllm.cli.output import fail_with, out, print_json
from zllm.errors import ZllmError


def register(app: typer.Typer) -> None:
    app.command("count-tokens")(count_tokens)


def count_tokens(
    file: Path = typer.Argument(..., help="A request body (Chat Completions, Responses or Anthropic Messages) as JSON."),
    model: str = typer.Option(None, "--model", "-m", help="Count for this stored model. [env: ZLLM_MODEL; default: smollm2]"),
    fmt: str = typer.Option(None, "--format", "-f", help="Read the file as chat, responses or anthropic instead of guessing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Count a request's prompt tokens as the daemon would render it: total, system, tools, each message."""
    # imported here: loading the decoders and transformers is for this verb only, not for every `zllm` run
    from zllm.inspect import count_tokens_file, format_count

    try:
        count = count_tokens_file(file, model=model, fmt=fmt)
    except ZllmError as exc:
        fail_with(exc)
    if as_json:
        print_json(count.to_json())
    else:
        out.print(format_count(count), end="", soft_wrap=True)
