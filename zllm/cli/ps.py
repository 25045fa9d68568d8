"""`zllm ps`: what the daemon has loaded, its memory, and the tool-call dialect with how it was chosen.

    $ zllm ps
    NAME        ARCHITECTURE       PARAMS   DEVICE   DTYPE     CONTEXT   WEIGHTS    KV CACHE           DIALECT
    smollm2     LlamaForCausalLM   135M     cpu      float32   8192      538.1 MB   12.6 MB / 2.1 GB   hermes_json
    dialect hermes_json: the chat template mentions <tool_call>            (stderr: how it was chosen)
"""

from __future__ import annotations

import typer

from zllm.cli.connect import connect, daemon_errors
from zllm.cli.output import err, print_json
from zllm.cli.table import write_table
from zllm.cli.units import human_count, human_size
from zllm.control.protocol import LoadedModelInfo


def register(app: typer.Typer) -> None:
    app.command("ps")(ps)


def ps(as_json: bool = typer.Option(False, "--json", help="Print the loaded models as JSON.")) -> None:
    """Show the model the daemon has loaded: size, memory (weights and KV cache), context, dialect."""
    with daemon_errors():
        models = connect().ps()
    if as_json:
        print_json([m.to_json() for m in models])
        return
    if not models:
        err.print("no model loaded yet (the daemon is still loading it)")
        return
    write_table(("NAME", "ARCHITECTURE", "PARAMS", "DEVICE", "DTYPE", "CONTEXT", "WEIGHTS", "KV CACHE", "DIALECT"),
                [_row(m) for m in models])
    for m in models:
        if m.dialect_reason:
            err.print(f"dialect {m.dialect}: {m.dialect_reason}", markup=False, highlight=False)


def _row(m: LoadedModelInfo) -> tuple[str, ...]:
    kv = human_size(m.kv_cache_bytes)
    if m.kv_cache_budget_bytes:
        kv += f" / {human_size(m.kv_cache_budget_bytes)}"
    return (m.name, m.architecture or "-", human_count(m.parameters), m.device or "-", m.dtype or "-",
            str(m.context_length), human_size(m.model_bytes), kv, m.dialect or "-")
