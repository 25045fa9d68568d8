"""The typer app. Each verb group lives in its own module and registers itself here.

`main()` owns the exit codes (cli/connect.py): 0 ok, 1 a failure the user can fix (usage errors included),
2 an internal error (a traceback only with ZLLM_DEBUG=1), 3 no daemon answers on the control socket.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from zllm import __version__
from zllm.cli.connect import EXIT_CODES_HELP, EXIT_INTERNAL, EXIT_USER

app = typer.Typer(
    name="zllm",
    help="A local LLM serving daemon for coding agents.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# typer vendors click (typer._click) in recent versions: find its UsageError through a public subclass
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

# verb modules, in --help order; each has register(app)
VERBS = ("serve", "lifecycle", "models", "ps", "cache", "trace", "count_tokens", "dialect", "clients", "config_cmd",
         "store_cmd")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zllm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """zllm serves local models over the OpenAI, Anthropic and Ollama APIs."""


def _register_verbs() -> None:
    # imported here so each verb module can import `app`-independent helpers without cycles
    for name in VERBS:
        importlib.import_module(f"zllm.cli.{name}").register(app)


_register_verbs()


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, standalone_mode=False)
    except UsageError as exc:  # a mistyped flag is the user's to fix: 1, not click's 2
        if type(exc).__name__ == "NoArgsIsHelpError":  # `zllm` or `zllm cache` alone: the help was the answer
            sys.exit(0)
        command = exc.ctx.command_path if exc.ctx is not None else "zllm"
        sys.stderr.write(f"error: {exc.format_message()}\nhint: see `{command} --help`\n")
        code = EXIT_USER
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except Exception as exc:
        if os.environ.get("ZLLM_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"error: internal error: {type(exc).__name__}: {exc}\n"
                         "hint: this is a bug in zllm; rerun with ZLLM_DEBUG=1 for the traceback and report it\n")
        code = EXIT_INTERNAL
    sys.exit(code if isinstance(code, int) else 0)
