"""`zllm store stats / prune`: the daemon's Responses store (previous_response_id chains), sized and trimmed.

    $ zllm store stats
    path        /home/me/.local/state/zllm/responses.sqlite3
    stored      1,204 responses, 48.2 MB (bound 1.0 GiB, 10,000 rows, 30d)
    on disk     52.0 MB
    oldest      3d2h ago
    $ zllm store prune --older-than 7d          # or --max-size 200MB, or --all; then the file is compacted

Stored rows repeat their conversation (one lookup per turn), so a long agent session is where the bytes go.
"""

from __future__ import annotations

import time

import typer

from zllm.cli.connect import EXIT_USER, connect, daemon_errors
from zllm.cli.output import err, fail, fail_with, print_json
from zllm.cli.table import write_fields
from zllm.cli.units import human_duration, human_size, parse_duration, parse_size
from zllm.errors import ZllmError

store_app = typer.Typer(name="store", help="Size and trim the daemon's stored Responses.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")


@store_app.command("stats")
def stats(as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON.")) -> None:
    """Rows, bytes stored and on disk, the oldest row, and the bounds."""
    with daemon_errors():
        data = connect().store_stats()
    if as_json:
        print_json(data)
        return
    write_fields(stats_lines(data))


def stats_lines(d: dict, now: float | None = None) -> list[tuple[str, str]]:
    lines = [("path", d["path"]),
             ("stored", f"{d['rows']:,} responses, {human_size(d['bytes'])} ({_bounds(d)})"),
             ("on disk", human_size(d["file_bytes"]))]
    if d.get("oldest") is not None:
        lines.append(("oldest", f"{human_duration((now or time.time()) - d['oldest'])} ago"))
    return lines


def _bounds(d: dict) -> str:
    parts = [f"bound {human_size(d['max_bytes'])}" if d.get("max_bytes") else "no size bound",
             f"{d['max_rows']:,} rows" if d.get("max_rows") else "no row bound",
             human_duration(d["max_age_s"]) if d.get("max_age_s") else "no age bound"]
    return ", ".join(parts)


@store_app.command("prune")
def prune(
    older_than: str = typer.Option(None, "--older-than", help="Responses stored longer ago than this (30m, 2h, 7d)."),
    max_size: str = typer.Option(None, "--max-size", help="Trim down to this size, oldest first (200MB, 1GiB)."),
    everything: bool = typer.Option(False, "--all", help="Every stored response."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Remove stored Responses by age or size (their previous_response_id chains end there), then compact."""
    try:
        older_than_s = parse_duration(older_than) if older_than else None
        max_bytes = 0 if everything else (parse_size(max_size) if max_size else None)
    except ZllmError as exc:
        fail_with(exc)
    if older_than_s is None and max_bytes is None:
        fail("nothing to prune by", hint="give --older-than, --max-size or --all", code=EXIT_USER)
    with daemon_errors():
        report = connect().store_prune(older_than_s=older_than_s, max_bytes=max_bytes)
    if as_json:
        print_json(report)
        return
    err.print(f"removed {report['removed']:,} responses; {report['rows']:,} left, {human_size(report['bytes'])} "
              f"({human_size(report['file_bytes'])} on disk)")
