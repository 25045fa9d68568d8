"""People-facing text for inspection results: rich `Text` (never markup, so prompt text with `[brackets]`
prints as it is; `str(text)` is the plain form).

    diverged at token 57 (cached 240, request 240 tokens), in tool 0 (Read)
    cause: reordered tools
      the same 3 tools come in a different order: tool 0 is Read (was Bash); send tools in a stable order
      before   "…function signatures within <tools></tools> XML tags:\\n<tools>\\n{\\"type\\": …\\"name\\": \\""
      cached   "Bash\\", \\"description\\": …"
      request  "Read\\", \\"description\\": …"

    prompt.json · Anthropic Messages (top-level `system`) · model tiny-qwen
      system block               33
      tools                     163
        tool instructions        78
        tool 0 (Bash)            43
        tool 1 (Read)            42
      message 1 (user)            9
      generation prompt           3
      total                     208   of a 192-token window: too long
"""

from __future__ import annotations

import json

from rich.text import Text

from zllm.diagnosis.causes import Cause
from zllm.diagnosis.explain import MissExplanation
from zllm.inspect.count_tokens import TokenCount

_WINDOW_LABEL = 9


def format_explanation(expl: MissExplanation) -> Text:
    text = Text()
    text.append(_headline(expl) + "\n", style="bold")
    text.append("cause: ")
    text.append(expl.cause.label, style="bold yellow" if expl.cause is not Cause.NO_MISS else "bold green")
    text.append(f"\n  {expl.detail}\n")
    if expl.divergence is not None:
        for name, window, style in (("before", "…" + expl.before, "dim"),
                                    ("cached", expl.cached_after + "…", "red"),
                                    ("request", expl.request_after + "…", "green")):
            text.append(f"  {name:<{_WINDOW_LABEL}}", style="bold")
            text.append(json.dumps(window, ensure_ascii=False) + "\n", style=style)
    return text


def _headline(expl: MissExplanation) -> str:
    sizes = (f" (cached {expl.cached_tokens}, request {expl.request_tokens} tokens)"
             if expl.cached_tokens is not None and expl.request_tokens is not None else "")
    if expl.divergence is None:
        return f"no divergence{sizes}"
    where = f", in {expl.segment}" if expl.segment else ""
    output = " inside the cached answer" if expl.in_prompt is False else ""
    entry = f" from {expl.entry_id} ({expl.tier})" if expl.entry_id else ""
    return f"diverged{entry} at token {expl.divergence}{output}{sizes}{where}"


def format_count(count: TokenCount) -> Text:
    text = Text()
    text.append(f"{count.path} · {count.format.label} ({count.format_reason}) · model {count.model}\n", style="dim")
    rows = _count_rows(count)
    width = max(len(indent + name) for indent, name, _ in rows) + 4
    for indent, name, tokens in rows:
        text.append(f"{indent + name:<{width}}{tokens:>8}\n")
    text.append(f"{'  total':<{width}}{count.total:>8}", style="bold")
    if count.context_length:
        fits = count.total < count.context_length
        text.append(f"   of a {count.context_length}-token window" + ("" if fits else ": too long"),
                    style="" if fits else "bold red")
    text.append("\n")
    for line in count.prompt.dropped:
        text.append(f"  (dropped before rendering: {line[:80]})\n", style="dim")
    return text


def _count_rows(count: TokenCount) -> list[tuple[str, str, int]]:
    """(indent, name, tokens): the tools as one row (the template's tool instructions and each schema under
    it), at the place they first appear; every other segment as it is."""
    rows: list[tuple[str, str, int]] = []
    for segment in count.prompt.segments:
        kind = segment.label.kind
        if kind not in ("tools", "tool"):
            rows.append(("  ", segment.label.name, segment.tokens))
            continue
        if not any(name == "tools" for _, name, _ in rows):
            rows.append(("  ", "tools", count.prompt.tokens_of("tools", "tool")))
        rows.append(("    ", "tool instructions" if kind == "tools" else segment.label.name, segment.tokens))
    return rows
