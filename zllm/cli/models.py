"""`zllm pull`, `zllm ls`, `zllm rm`: the model store from the command line.

These verbs work on the store directly (no daemon needed): the store is a directory and its own lock.
Data goes to stdout (`ls`, `ls --json`); progress and messages to stderr.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime

import typer

from zllm.cli.output import err, fail, fail_with, print_json
from zllm.config import load_settings
from zllm.errors import ZllmError
from zllm.models import Manifest, ModelStore, RichPullProgress, StoredModel


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
    app.command("ls")(ls)
    app.command("rm")(rm)


def _open_store() -> ModelStore:
    try:
        return ModelStore(load_settings().models_dir)
    except ZllmError as exc:
        fail_with(exc)


def human_size(size: int) -> str:
    """Decimal units, like `ollama list` and download sizes on the hub."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def pull(
    model: str = typer.Argument(
        ...,
        help="An alias (smollm2), a hub repo (org/name, org/name@rev, org/name-GGUF:Q4_K_M), a .gguf, a dir, "
        "ollama:MODEL[:TAG] or lmstudio:PUBLISHER/REPO[:QUANT].",
    ),
    name: str | None = typer.Option(None, "--name", help="Store it under this name instead of the default."),
    force: bool = typer.Option(False, "--force", "-f", help="Pull again and replace a model of the same name."),
    file: str | None = typer.Option(
        None, "--file", help="The GGUF file to take from a hub repo or LM Studio folder (instead of :QUANT)."
    ),
) -> None:
    """Pull a model into the local store (a no-op when it is already there)."""
    store = _open_store()
    started = time.monotonic()
    try:
        target = store.resolve_name(model, name, file=file)
        if not force and store.has(target) and not store.outdated(target):
            err.print(f"{target} is already in the store (pull again with --force)")
            return
        with RichPullProgress(err) as progress:
            stored = store.pull(model, name=name, force=force, progress=progress, file=file)
    except ZllmError as exc:
        fail_with(exc)
    except KeyboardInterrupt:
        fail("pull interrupted; the store is unchanged", code=130)
    elapsed = time.monotonic() - started
    m = stored.manifest
    err.print(
        f"[green]pulled[/] {m.name} ({m.architecture}, {_format(m)}, {human_size(m.size_bytes)}) in {elapsed:.1f}s"
    )


def _as_json(model: StoredModel) -> dict[str, object]:
    data = model.manifest.to_dict()
    data.pop("files")  # per-file digests: in the manifest on disk, too noisy for a listing
    return {**data, "path": str(model.path)}


def _format(m: Manifest) -> str:
    """`gguf Q4_K_M` or `safetensors bfloat16`: what the weights are and how they are stored."""
    detail = m.quantization if m.weights_format == "gguf" else m.dtype
    return f"{m.weights_format} {detail}" if detail else m.weights_format


def _as_row(model: StoredModel) -> tuple[str, ...]:
    m = model.manifest
    added = datetime.fromtimestamp(m.added_at).strftime("%Y-%m-%d %H:%M")
    return (m.name, m.architecture, _format(m), human_size(m.size_bytes), m.source, added)


def _write_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Plain aligned columns (like `ollama list`): readable in a terminal, greppable in a pipe."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        sys.stdout.write("   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")


def ls(as_json: bool = typer.Option(False, "--json", help="Print the manifests as JSON.")) -> None:
    """List the models in the local store."""
    models = _open_store().list()
    if as_json:
        print_json([_as_json(m) for m in models])
        return
    if not models:
        err.print("no models yet; pull one: zllm pull smollm2")
        return
    _write_table(("NAME", "ARCHITECTURE", "FORMAT", "SIZE", "SOURCE", "ADDED"), [_as_row(m) for m in models])


def rm(
    model: str = typer.Argument(..., help="The model's name, as `zllm ls` shows it."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Remove a model from the local store."""
    store = _open_store()
    try:
        stored = store.get(model)
    except ZllmError as exc:
        fail_with(exc)
    if not yes:
        if not sys.stdin.isatty():
            fail(f"not removing `{model}` without confirmation", hint="pass --yes")
        if not typer.confirm(f"remove {model} ({human_size(stored.manifest.size_bytes)})?", err=True):
            raise typer.Exit(1)
    try:
        store.remove(model)
    except ZllmError as exc:
        fail_with(exc)
    err.print(f"removed {model}")
