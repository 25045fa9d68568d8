"""`zllm dialect MODEL`: which tool dialect a model speaks, how it was found, and whether its round trip holds.

No daemon needed, and no torch or transformers: the model's tokenizer.json and chat template are read with the
`tokenizers` library and jinja2 (prompt/tokenizer_files.py), and the same check the daemon runs at load
(dialects/round_trip.py) runs here.

    $ zllm dialect smollm2
    dialect hermes (chosen by rule): default: Hermes JSON tool calls (the chat template ignores tools)
    round trip: holds (render → parse → render gives the same tokens)
    a call as the model writes it:
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    $ zllm dialect --template chat_template.jinja [--tokenizer MODEL] --json
    {"dialect": "hermes", "derived": false, "reason": "...", "round_trip": true, "problem": "", "sample": "...",
     "compared": "text"}
"""

from __future__ import annotations

from pathlib import Path

import typer

from zllm.cli.output import fail, fail_with, out, print_json
from zllm.errors import ZllmError


def register(app: typer.Typer) -> None:
    app.command("dialect")(dialect)


def dialect(
    model: str = typer.Argument(None, help="A stored model's name, or a model directory (tokenizer.json and its "
                                           "chat template)."),
    template: Path = typer.Option(None, "--template", help="Check this chat template (a .jinja file) instead of "
                                                          "the model's own."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="With --template: the stored model or directory whose "
                                                           "tokenizer to count with (without one, text is compared)."),
    dialect_name: str = typer.Option(None, "--dialect", help="Check this dialect instead of the one the rules "
                                                            "choose. [env: ZLLM_DIALECT]"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show a model's tool-call dialect, why it was chosen, and whether render → parse → render holds."""
    from zllm.prompt.dialect_check import describe_dialect
    from zllm.prompt.renderer import PromptRenderer

    if template is None and model is None:
        fail("name a model or give --template FILE", hint="zllm dialect smollm2, or zllm dialect --template t.jinja")
    if template is not None and model is not None:
        fail("give a model or --template, not both", hint="--tokenizer MODEL counts a template with MODEL's tokenizer")
    try:
        files = _tokenizer_files(model or tokenizer) if (model or tokenizer) else _no_tokenizer()
        if template is not None:
            files.chat_template = _read_template(template)
        report = describe_dialect(PromptRenderer(files, dialect_override=dialect_name or _configured_dialect()),
                                  tokens=bool(model or tokenizer))
    except ZllmError as exc:
        fail_with(exc)
    if as_json:
        print_json(report.to_json())
        return
    how = "derived from the template" if report.derived else "chosen by rule"
    out.print(f"dialect {report.dialect} ({how}): {report.reason}", markup=False, soft_wrap=True)
    held = f"holds (render → parse → render gives the same {report.compared})"
    verdict = held if report.check.held else "FAILS: " + report.check.problem
    out.print(f"round trip: {verdict}", markup=False, soft_wrap=True)
    if report.check.sample:
        out.print("a call as the model writes it:", markup=False, soft_wrap=True)
        out.print(report.check.sample, markup=False, soft_wrap=True)


def _tokenizer_files(name: str):
    from zllm.prompt.tokenizer_files import TokenizerFiles

    path = Path(name).expanduser()
    if path.is_dir():
        return TokenizerFiles.from_dir(path)
    from zllm.inspect.renderer import resolve_model

    return TokenizerFiles.from_dir(resolve_model(name).path)


def _no_tokenizer():
    """A template alone: an empty vocabulary (no added tokens for the rules to read; text is compared)."""
    from tokenizers import Tokenizer, models

    from zllm.prompt.tokenizer_files import TokenizerFiles

    return TokenizerFiles(Tokenizer(models.BPE()), {}, None)


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read the template {path}: {exc}")


def _configured_dialect() -> str | None:
    from zllm.config import load_settings

    return load_settings().dialect
