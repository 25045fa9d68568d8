"""`zllm ps`: what the daemon has loaded, its memory, and the tool-call dialect with how it was chosen.

    $ zllm ps
    NAME     ARCHITECTURE      PARAMS  BACKEND   DEVICE  DTYPE  CONTEXT  WEIGHTS  KV CACHE                RESIDENT  DIALECT
    smollm2  LlamaForCausalLM  135M    llamacpp  cpu     Q4_1   8192     96.6 MB  377.7 MB / 377.7 MB f16 995.2 MB  hermes
    backend llamacpp: GGUF weights run on llama.cpp as they are             (stderr: how each was chosen)
    speculation on (auto: Q4_1 weights: a verify of up to 16 rows gives 1-token decoding's bits, no pad row; ...)
    dialect hermes: the chat template mentions <tool_call>
    dialect hermes: round trip holds (render → parse → render gives the same tokens)
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
    write_table(("NAME", "ARCHITECTURE", "PARAMS", "BACKEND", "DEVICE", "DTYPE", "CONTEXT", "WEIGHTS", "KV CACHE",
                 "RESIDENT", "DIALECT"), [_row(m) for m in models])
    for m in models:
        if m.backend_reason:
            err.print(f"backend {m.backend}: {m.backend_reason}", markup=False, highlight=False)
        if m.speculation:
            err.print(f"speculation {m.speculation}", markup=False, highlight=False)
        if m.dialect_reason:
            err.print(f"dialect {m.dialect}: {m.dialect_reason}", markup=False, highlight=False)
        if m.dialect_round_trip is not None:
            err.print(f"dialect {m.dialect}: {_round_trip(m)}", markup=False, highlight=False)


def _round_trip(m: LoadedModelInfo) -> str:
    text = f"; {m.dialect_text_turn}" if m.dialect_text_turn else ""
    if m.dialect_round_trip:
        return f"round trip holds (render → parse → render gives the same tokens){text}"
    return f"round trip FAILS: {m.dialect_problem}{text} (served anyway; see `zllm dialect`)"


def _row(m: LoadedModelInfo) -> tuple[str, ...]:
    kv = human_size(m.kv_cache_bytes)
    if m.kv_cache_budget_bytes:
        kv += f" / {human_size(m.kv_cache_budget_bytes)}"
    if m.kv_cache_type:
        kv += f" {m.kv_cache_type}"
    return (m.name, m.architecture or "-", human_count(m.parameters), m.backend or "-", m.device or "-",
            m.quantization or m.dtype or "-", str(m.context_length), human_size(m.model_bytes), kv,
            human_size(m.resident_bytes) if m.resident_bytes else "-", m.dialect or "-")
