"""The daemon's measured prefill rate (prompt tokens per second), as `ps` reports it: what `zllm claude` and
`zllm codex` size the clients' timeouts from (a cold prefill of a full window must fit in them).

    rate = measured_prefill_rate(trace.recent(RECENT), cost_s_per_token=stats.prefill_s_per_token)
    # 412.0, or None when nothing was measured yet

The recent requests in the trace ring come first: their prefill time is wall-clock time from admission to the
first logits, so it counts what a client waits for on this machine now (other requests sharing the engine,
a busy CPU). Without any (a daemon just started), the prefix cache's estimate: forward time only, but kept
across restarts with the SSD tier (kvcache/cost.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

RECENT = 32  # reports looked at (the newest)
# prefills shorter than this are mostly fixed overhead (kvcache/cost.py's reasoning), not per-token cost
MIN_PREFILLED_TOKENS = 64


class PrefillReport(Protocol):
    """What is read of a finished request's report (runtime/report.py's RequestReport)."""

    prompt_tokens: int
    cached_tokens: int
    prefill_s: float | None


def measured_prefill_rate(reports: Iterable[PrefillReport], cost_s_per_token: float | None = None) -> float | None:
    """Prompt tokens prefilled per second: over `reports` (all their tokens over all their time, so long
    prefills weigh most), else 1 / `cost_s_per_token`; None when neither measured anything."""
    tokens, seconds = 0, 0.0
    for report in reports:
        prefilled = report.prompt_tokens - report.cached_tokens
        if report.prefill_s and report.prefill_s > 0 and prefilled >= MIN_PREFILLED_TOKENS:
            tokens += prefilled
            seconds += report.prefill_s
    if tokens:
        return tokens / seconds
    if cost_s_per_token and cost_s_per_token > 0:
        return 1.0 / cost_s_per_token
    return None
