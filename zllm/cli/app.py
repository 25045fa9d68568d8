"""The typer app. Each verb group lives in its own module and registers itself here."""

from __future__ import annotations

import typer

from zllm import __version__

app = typer.Typer(
    name="zllm",
    help="A local LLM serving daemon for coding agents.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zllm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """zllm serves local models over the OpenAI and Anthropic APIs."""


def _register_verbs() -> None:
    # imported here so each verb module can import `app`-independent helpers without cycles
    from zllm.cli import models, serve

    for module in (serve, models):
        module.register(app)


_register_verbs()


def main() -> None:
    app()
