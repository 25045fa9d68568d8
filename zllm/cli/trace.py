"""`zllm trace`: requests as they run — a live table on a terminal, one line each in a pipe, NDJSON with --json.

    $ zllm trace --last 2 --json                    # one RequestReport JSON per line (runtime/report.py)
    {"phase": "finished", "request_id": "chatcmpl-…", "api": "chat", "prompt_tokens": 1204, ...}
    $ zllm trace | cat                              # the last 10, then live; one line per report
    12:01:03 done chatcmpl-5f1c chat tiny-qwen ns 3f2a91c0 prompt 1,204 cached 1,100 (device) restore 0.01s
             ttft 0.12s 25.3 tok/s out 12 stop · dialect hermes_json · tools: read_file
    12:02:10 prefill 23% msg_7c0e messages tiny-qwen ns 3f2a91c0 prompt 4,352/18,749 cached 0 (cold) ...

A long prefill is reported as it begins and then about once a second ("prefilling" reports: `prefilled_tokens`
of `prompt_tokens` in the cache); following starts with the requests under way.

`--last N` alone prints the last N finished requests and exits; with no --last it follows (until Ctrl-C).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable

import typer

from zllm.cli.connect import connect, daemon_errors
from zllm.cli.interrupts import ctrl_c_ends_the_follow
from zllm.cli.output import out

LIVE_ROWS = 20
SHOW_CURSOR = b"\x1b[?25h\n"  # the live table hides it
COLUMNS = ("TIME", "STATE", "REQUEST", "API", "MODEL", "NS", "PROMPT", "CACHED", "RESTORE", "TTFT", "TOK/S", "OUT",
           "FINISH", "NOTES")


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


def trace(
    as_json: bool = typer.Option(False, "--json", help="Print NDJSON: one request report per line."),
    last: int = typer.Option(None, "--last", "-n", min=0, help="Show the last N finished requests (then exit, "
                                                               "unless --follow)."),
    follow: bool = typer.Option(None, "--follow/--no-follow", "-f", help="Keep showing requests as they run "
                                                                        "(the default without --last)."),
) -> None:
    """Show requests as they run: tokens, cache hits and tier, timings, dialect, tool calls, finish, notes."""
    following = follow if follow is not None else last is None
    if following:
        ctrl_c_ends_the_follow(restore=SHOW_CURSOR if not as_json and out.is_terminal else b"")
    try:
        with daemon_errors():
            reports = connect().trace(last=10 if last is None else last, follow=following)
            if as_json:
                _print_ndjson(reports)
            elif following and out.is_terminal:
                _live(reports)
            else:
                for report in reports:
                    _print_line(report)
    except KeyboardInterrupt:  # the way to stop following
        return


def _print_ndjson(reports: Iterable[dict]) -> None:
    for report in reports:
        sys.stdout.write(json.dumps(report, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def _print_line(report: dict) -> None:
    cells = dict(zip(COLUMNS, row(report), strict=True))
    head = " ".join(cells[c] for c in ("TIME", "STATE", "REQUEST", "API", "MODEL"))
    body = (f"ns {cells['NS']} prompt {cells['PROMPT']} cached {cells['CACHED']} restore {cells['RESTORE']} "
            f"ttft {cells['TTFT']} {cells['TOK/S']} tok/s out {cells['OUT']} {cells['FINISH']}")
    notes = f" · {cells['NOTES']}" if cells["NOTES"] else ""
    sys.stdout.write(f"{head} {body}{notes}\n")
    sys.stdout.flush()


def row(r: dict) -> tuple[str, ...]:
    cached = f"{r.get('cached_tokens', 0):,} ({r.get('cache_tier', '?')})"
    prefilling = r.get("phase") == "prefilling"
    return (
        time.strftime("%H:%M:%S", time.localtime(r.get("at", 0))),
        state(r),
        str(r.get("request_id", "")),
        str(r.get("api", "")),
        str(r.get("model", "")),
        str(r.get("namespace", ""))[:8] or "-",
        # a prefilling request: how much of its prompt is in the cache so far
        f"{r.get('prefilled_tokens', 0):,}/{r.get('prompt_tokens', 0):,}" if prefilling
        else f"{r.get('prompt_tokens', 0):,}",
        cached,
        _seconds(r.get("restore_s")),
        _seconds(r.get("ttft_s")),
        "-" if r.get("decode_tok_s") is None else f"{r['decode_tok_s']:.1f}",
        str(r.get("completion_tokens", 0)),
        str(r.get("finish_reason") or "-"),
        notes(r),
    )


def state(r: dict) -> str:
    """"prefill 23%" (the share of the prompt in the cache), "running" (generating) or "done"."""
    phase = r.get("phase")
    if phase == "prefilling":
        return f"prefill {progress(r.get('prefilled_tokens', 0), r.get('prompt_tokens', 0))}"
    return "running" if phase == "started" else "done"


def progress(done: int, total: int) -> str:
    return f"{100 * done // total}%" if total > 0 else "-"


def notes(r: dict) -> str:
    parts = []
    if r.get("dialect"):
        parts.append(f"dialect {r['dialect']}")
    if r.get("fence") and r["fence"] != "off":
        parts.append(f"fence {r['fence']}")
    parts += list(r.get("fence_events") or [])
    if r.get("tool_calls"):
        parts.append("tools: " + ", ".join(r["tool_calls"]))
    if r.get("near_miss"):
        parts.append(r["near_miss"])
    if r.get("cache_rejected"):
        parts.append(r["cache_rejected"])
    if r.get("error"):
        parts.append(f"error: {r['error']}")
    parts += list(r.get("notes") or [])
    return " · ".join(parts)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _live(reports: Iterable[dict]) -> None:
    """A table of the newest requests, each row updated in place from "running" to "done"."""
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    rows: dict[str, tuple[str, ...]] = {}

    def render() -> Table:
        table = Table(*COLUMNS, box=None, header_style="bold", pad_edge=False)
        for cells in list(rows.values())[-LIVE_ROWS:]:
            table.add_row(*(Text(cell) for cell in cells))  # ids and notes are not markup
        return table

    # redrawn on each report only: the table changes with nothing else, and without rich's refresh thread a
    # Ctrl-C that lands inside a redraw cannot leave a lock that thread then waits on forever (a hang seen in CI)
    with Live(render(), console=out, auto_refresh=False) as live:
        for report in reports:
            rows.pop(report.get("request_id", ""), None)  # re-inserted last: newest at the bottom
            rows[report.get("request_id", "")] = row(report)
            live.update(render(), refresh=True)
