"""`zllm cache ls / stats / prune / explain-miss`: the daemon's prefix cache, inspected and trimmed.

    $ zllm cache ls
    ID                TIER     NAMESPACE   TOKENS   SIZE     AGE     HITS
    chatcmpl-5f1c…    device   3f2a91c0    1,204    4.1 MB   2m10s   3
    $ zllm cache prune --older-than 2d --tier ssd --dry-run
    $ zllm cache explain-miss                       # the latest near miss, explained
    $ zllm cache explain-miss --between a.json b.json   # two request files, offline (no daemon)
    $ zllm cache explain-miss --id msg_01…          # the cache diagnosis that response carried
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from zllm.cache_views import ALL_TIERS, PRUNE_CHOICES, CacheEntry, CacheStats, SsdStats
from zllm.cli.connect import EXIT_USER, connect, daemon_errors
from zllm.cli.explain_view import print_diagnosis, print_explanation, print_near_miss
from zllm.cli.output import err, fail, fail_with, out, print_json
from zllm.cli.table import write_fields, write_table
from zllm.cli.units import (
    human_duration,
    human_size,
    parse_duration,
    parse_size,
    percent,
)
from zllm.errors import ZllmError

cache_app = typer.Typer(name="cache", help="Inspect and trim the daemon's prefix cache.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
def ls(as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON.")) -> None:
    """List cached entries of both tiers (device, SSD): id, namespace, tokens, bytes, tier, age, hits."""
    with daemon_errors():
        entries = connect().cache_ls()
    if as_json:
        print_json([e.to_json() for e in entries])
        return
    if not entries:
        err.print("the prefix cache is empty")
        return
    write_table(("ID", "TIER", "NAMESPACE", "TOKENS", "SIZE", "AGE", "HITS"), [_row(e) for e in entries])


def _row(e: CacheEntry, now: float | None = None) -> tuple[str, ...]:
    age = (now or time.time()) - e.created
    return (e.id, e.tier, e.namespace[:8], f"{e.tokens:,}", human_size(e.bytes), human_duration(age), str(e.hits))


@cache_app.command("stats")
def stats(as_json: bool = typer.Option(False, "--json", help="Print the counters as JSON.")) -> None:
    """Fill levels, hit rates by tier, bytes."""
    with daemon_errors():
        data = connect().cache_stats()
    if as_json:
        print_json(data)
        return
    if not data.get("enabled"):
        err.print("the prefix cache is off (ZLLM_CACHE_ROUNDS=0)")
        return
    write_fields(_stats_lines(data))


def _stats_lines(data: dict) -> list[tuple[str, str]]:
    s = CacheStats.from_json(data)
    lines = [
        ("device tier", f"{human_size(s.device_bytes)} of {human_size(s.device_budget_bytes)} "
                        f"({percent(s.device_fill)}), {s.entries} entries in "
                        f"{s.namespaces} namespaces, {human_size(s.pool_bytes)} working buffers"),
    ]
    if s.ssd is not None:
        lines.append(("ssd tier", f"{human_size(s.ssd.bytes)} of {human_size(s.ssd.budget_bytes)} "
                                  f"({percent(s.ssd_fill)}), {s.ssd.snapshots} snapshots" + _set_aside(s.ssd)))
    else:
        lines.append(("ssd tier", f"off ({s.ssd_off})" if s.ssd_off else "off"))
    lines += [
        ("requests", f"{s.requests}: {s.device_hits} device hits ({percent(s.device_hit_rate)}), "
                     f"{s.ssd_hits} ssd hits ({percent(s.ssd_hit_rate)}), {s.cold} cold"),
        ("tokens", f"{s.prompt_tokens:,} prompt, {s.cached_tokens:,} cached ({percent(s.token_hit_rate)})"),
        ("near misses", str(s.near_misses)),
    ]
    if s.ssd is not None:
        lines.append(("restore cost", _restore_cost(s)))
    if s.main_spared:  # the main-conversation rule (kvcache/retention.py) decided an eviction
        lines.append(("retention", f"{s.main_spared} evictions took a side request's state, "
                                   "not a main conversation"))
    return lines


def _restore_cost(s: CacheStats) -> str:
    """The estimate that decides whether an SSD prefix is read or recomputed (kvcache/cost.py), and how often it
    said recompute."""
    prefill = f"prefill {s.prefill_s_per_token * 1e3:.2f} ms/token" if s.prefill_s_per_token else "prefill not measured"
    if s.restore_s_per_byte:
        restore = f"restore {s.restore_s_fixed * 1e3:.1f} ms + {s.restore_s_per_byte * 1e9:.2f} ms/MB"
    else:
        restore = "restore not measured"
    return f"{prefill}, {restore}; {s.ssd_not_worth_it} SSD prefixes left unread (recomputing was faster)"


def _set_aside(ssd: SsdStats) -> str:
    """What the SSD tier took out of service as damaged (kept in its quarantine directory)."""
    parts = [f"{ssd.quarantined} damaged set aside"] if ssd.quarantined else []
    parts += [f"{ssd.strays} stray files set aside"] if ssd.strays else []
    parts += ["its index set aside"] if ssd.index_set_aside else []
    return f"; {', '.join(parts)}" if parts else ""


@cache_app.command("prune")
def prune(
    older_than: str = typer.Option(None, "--older-than", help="Entries older than this (30m, 2h, 7d)."),
    max_size: str = typer.Option(None, "--max-size", help="Trim each tier down to this size (500MB, 2GiB)."),
    tier: str = typer.Option(ALL_TIERS, "--tier", help="device, ssd or all."),
    namespace: str = typer.Option(None, "--namespace", help="Only this namespace (a prefix as `cache ls` shows)."),
    everything: bool = typer.Option(False, "--all", help="Everything in the chosen tier(s)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed; remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Remove cached entries by age, size, tier or namespace."""
    try:
        older_than_s = 0.0 if everything else (parse_duration(older_than) if older_than else None)
        max_bytes = parse_size(max_size) if max_size else None
    except ZllmError as exc:
        fail_with(exc)
    if tier not in PRUNE_CHOICES:
        fail(f"--tier must be device, ssd or all, not {tier!r}", code=EXIT_USER)
    if older_than_s is None and max_bytes is None and namespace is None:
        fail("nothing to prune by", hint="give --older-than, --max-size, --namespace or --all", code=EXIT_USER)
    with daemon_errors():
        report = connect().cache_prune(older_than_s=older_than_s, max_bytes=max_bytes, tier=tier,
                                       namespace=namespace, dry_run=dry_run)
    if as_json:
        print_json(report.to_json())
        return
    removed = [CacheEntry.from_json(e) for e in report.removed]
    if removed:
        write_table(("ID", "TIER", "NAMESPACE", "TOKENS", "SIZE", "AGE", "HITS"), [_row(e) for e in removed])
    verb = "would remove" if dry_run else "removed"
    err.print(f"{verb} {len(removed)} entries, {human_size(report.freed_bytes)}"
              + (" (estimate)" if dry_run and max_bytes is not None else ""))


@cache_app.command("explain-miss")
def explain_miss(
    request_id: str = typer.Argument(None, help="A request id (as `zllm trace` shows it); default: the latest miss."),
    between: tuple[Path, Path] = typer.Option(None, "--between", metavar="A.json B.json",
                                              help="Compare two request files offline (no daemon needed)."),
    model: str = typer.Option(None, "--model", "-m", help="With --between: the model whose template renders them."),
    response_id: str = typer.Option(None, "--id", metavar="RESP",
                                    help="A response id (msg_… / resp_…) whose request asked for cache diagnostics."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
) -> None:
    """Explain why a request missed the prefix cache: where the token streams diverged, and the likely cause."""
    if sum(x is not None and x != () for x in (request_id, between, response_id)) > 1:
        fail("give one of REQUEST_ID, --between or --id", code=EXIT_USER)
    if between:
        _explain_files(between[0], between[1], model, as_json)
        return
    if response_id:
        _explain_response(response_id, as_json)
        return
    with daemon_errors():
        answer = connect().explain(request_id)
    if as_json:
        print_json(answer)
        return
    if answer.get("request_id"):
        out.print(f"request {answer['request_id']}", markup=False, highlight=False, soft_wrap=True)
    if not _print_explanation_json(answer.get("explanation")):
        print_near_miss(answer["near_miss"])


def _print_explanation_json(data: dict | None) -> bool:
    """The daemon's explanation, shown exactly as `--between` shows one; False if it cannot be read back
    (none given, or a daemon of another version named a cause this CLI does not know)."""
    if data is None:
        return False
    import dataclasses

    from zllm.inspect import Cause, MissExplanation, format_explanation

    known = {f.name for f in dataclasses.fields(MissExplanation)} - {"cause"}
    try:
        explanation = MissExplanation(cause=Cause(data["cause"]), **{k: v for k, v in data.items() if k in known})
    except (KeyError, TypeError, ValueError):
        print_explanation(data)
        return True
    out.print(format_explanation(explanation), end="", soft_wrap=True)  # data: never wrapped at 80 columns
    return True


def _explain_response(response_id: str, as_json: bool) -> None:
    with daemon_errors():
        answer = connect().diagnosis(response_id)
    if as_json:
        print_json(answer)
        return
    print_diagnosis(answer["response_id"], answer["diagnosis"])
    data = answer["diagnosis"]
    if data.get("divergence") is not None:  # a miss with a place: shown as every explanation is
        _print_explanation_json({"cause": data.get("cause") or "unknown", "detail": data.get("detail", ""),
                                 "divergence": data["divergence"], "segment": data.get("segment"),
                                 "before": data.get("before", ""), "cached_after": data.get("cached_after", ""),
                                 "request_after": data.get("request_after", ""),
                                 "cached_tokens": data.get("reusable_tokens"), "in_prompt": True})


def _explain_files(a: Path, b: Path, model: str | None, as_json: bool) -> None:
    from zllm.inspect import explain_between_files, format_explanation  # loads a tokenizer: only on this path

    try:
        result = explain_between_files(a, b, model=model)  # None: the configured model
    except ZllmError as exc:
        fail_with(exc)
    if as_json:
        print_json(result.to_json())
        return
    out.print(format_explanation(result), end="", soft_wrap=True)
