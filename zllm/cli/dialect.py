"""`zllm dialect MODEL`: which tool dialect a model speaks, how it was found, and whether its round trip holds.

No daemon needed, and no torch or transformers: the model's tokenizer.json and chat template are read with the
`tokenizers` library and jinja2, and the same check the daemon runs at load runs here (zllm/inspect/dialect.py).

    $ zllm dialect smollm2
    dialect hermes (chosen by rule): default: Hermes JSON tool calls (the chat template ignores tools)
    round trip: holds (render → parse → render gives the same tokens)
    a call as the model writes it:
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    $ zllm dialect --template chat_template.jinja [--tokenizer MODEL] --json
    {"dialect": "hermes", "derived": false, "reason": "...", "round_trip": true, "problem": "", "sample": "...",
     "text_turn": "", "compared": "text"}

`text_turn` (printed as "turn of text: ...") says what forks the cache after an answer in text, where the template
renders it otherwise than its generation prompt began it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zllm.cli.output import fail, fail_with, out, print_json
from zllm.config import load_settings
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
    # imported here: the tokenizer and template machinery is for this verb only
    from zllm.inspect.dialect import inspect_dialect

    if template is None and model is None:
        fail("name a model or give --template FILE", hint="zllm dialect smollm2, or zllm dialect --template t.jinja")
    if template is not None and model is not None:
        fail("give a model or --template, not both", hint="--tokenizer MODEL counts a template with MODEL's tokenizer")
    try:
        report = inspect_dialect(model=model, template=template, tokenizer=tokenizer,
                                 dialect=dialect_name or load_settings().dialect)
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
    if report.check.text_turn:
        out.print(f"turn of text: {report.check.text_turn}", markup=False, soft_wrap=True)
    if report.check.sample:
        out.print("a call as the model writes it:", markup=False, soft_wrap=True)
        out.print(report.check.sample, markup=False, soft_wrap=True)

