"""Fallback text views for `zllm cache explain-miss`, on stdout: a raw near-miss record (a daemon without the
explainer), and an explanation this CLI cannot read back into zllm.inspect's `MissExplanation` (a daemon of
another version). Normally zllm.inspect.display renders explanations.

    near miss of chatcmpl-9a1c (device tier) at token 1,204 of 1,310 cached; the request has 1,402 tokens
    where     system (in the cached prompt)
    shared    …the repository's conventions. Current time:
    cached    10:00:00 UTC\\nYou are…
    request   10:05:00 UTC\\nYou are…

An unreadable explanation is shown as `name  value` lines, known fields first, so that nothing is lost.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from zllm.cli.table import write_fields

_FIRST = ("cause_label", "cause", "detail", "segment", "divergence")


def print_near_miss(record: dict[str, Any]) -> None:
    sys.stdout.write(
        f"near miss of {record.get('entry_id')} ({record.get('tier')} tier) at token "
        f"{record.get('divergence', 0):,} of {record.get('entry_tokens', 0):,} cached; "
        f"the request has {record.get('request_tokens', 0):,} tokens\n")
    in_prompt = record.get("in_prompt")
    where = record.get("segment") or "?"
    if in_prompt is not None:
        where += " (in the cached prompt)" if in_prompt else " (in the cached reply: the template re-rendered it)"
    write_fields([("where", where), ("shared", "…" + _visible(record.get("before", ""))),
                  ("cached", _visible(record.get("entry_after", "")) + "…"),
                  ("request", _visible(record.get("request_after", "")) + "…")])


def print_diagnosis(response_id: str, diagnosis: dict[str, Any]) -> None:
    """The headline of a response's cache diagnosis: what it was compared with, the reason, what it missed."""
    reason = diagnosis.get("reason")
    compared = diagnosis.get("compared_with") or "?"
    if reason is None:
        reused = diagnosis.get("reusable_tokens", 0)
        headline = f"no miss: the prompt of {compared} ({reused:,} tokens) was reused whole"
    elif reason in ("not_found", "unavailable"):
        headline = f"{reason.replace('_', ' ')}: {diagnosis.get('detail') or ''}".rstrip(": ")
    else:
        headline = (f"{reason} changed since {compared}: {diagnosis.get('missed_tokens', 0):,} of its "
                    f"{diagnosis.get('reusable_tokens', 0):,} prompt tokens could not be reused")
    sys.stdout.write(f"response {response_id}: {headline}\n")
    busters = diagnosis.get("busters") or []
    if busters:
        write_fields([("busters", "; ".join(_visible(b) for b in busters))])
    if diagnosis.get("divergence") is None and diagnosis.get("detail") and reason not in ("not_found", "unavailable"):
        write_fields([("detail", _visible(diagnosis["detail"]))])


def print_explanation(explanation: dict[str, Any]) -> None:
    ordered = [k for k in _FIRST if k in explanation] + [k for k in explanation if k not in _FIRST]
    write_fields([(key.replace("_", " "), _scalar(explanation[key])) for key in ordered
                  if explanation[key] not in (None, "", [], {})])


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return _visible(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(_visible(v) for v in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _visible(text: str) -> str:
    """Whitespace made visible on one line: the difference is often exactly there."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
