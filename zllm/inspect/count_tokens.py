"""`zllm count-tokens`: how many prompt tokens a request file costs on a model, and where they go.

    {"file": "prompt.json", "format": "anthropic", "format_reason": "top-level `system`",
     "model": "tiny-qwen", "context_length": 192, "total": 199,
     "system": 11, "tools": 174, "messages": 11, "generation_prompt": 3,
     "segments": [{"name": "system block", "kind": "system", "index": 0, "tokens": 11},
                  {"name": "tools", "kind": "tools", "index": null, "tokens": 79},
                  {"name": "tool 0 (Bash)", "kind": "tool", "index": 0, "tokens": 95},
                  {"name": "message 1 (user)", "kind": "message", "index": 1, "tokens": 11},
                  {"name": "generation prompt", "kind": "generation", "index": null, "tokens": 3}],
     "dropped": ["x-anthropic-billing-header: cc_version=…"]}

`total` is the prompt the daemon would feed the model for this request (its `usage.prompt_tokens` /
`input_tokens`), rendered by the same renderer; segments list each label once, in prompt order, with all
of its tokens (a system block the template splits around the tools is one entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zllm.canonical import ChatRequest
from zllm.diagnosis.segments import Label, map_segments
from zllm.inspect.formats import RequestFormat, read_request_file
from zllm.inspect.renderer import load_renderer, resolve_model


@dataclass(frozen=True)
class SegmentCount:
    label: Label
    tokens: int

    def to_json(self) -> dict:
        return {"name": self.label.name, "kind": self.label.kind, "index": self.label.index, "tokens": self.tokens}


@dataclass(frozen=True)
class PromptCount:
    total: int
    segments: tuple[SegmentCount, ...]
    dropped: tuple[str, ...] = ()  # per-session lines the renderer removed (they cost no tokens)

    def __post_init__(self) -> None:
        assert sum(s.tokens for s in self.segments) == self.total, "segments must add up to the total"

    def tokens_of(self, *kinds: str) -> int:
        return sum(s.tokens for s in self.segments if s.label.kind in kinds)


@dataclass(frozen=True)
class TokenCount:
    """A request file's count on one model."""

    path: Path
    format: RequestFormat
    format_reason: str
    model: str
    context_length: int | None
    prompt: PromptCount

    @property
    def total(self) -> int:
        return self.prompt.total

    def to_json(self) -> dict:
        p = self.prompt
        return {
            "file": str(self.path), "format": self.format.value, "format_reason": self.format_reason,
            "model": self.model, "context_length": self.context_length, "total": p.total,
            "system": p.tokens_of("system"), "tools": p.tokens_of("tools", "tool"),
            "messages": p.tokens_of("message", "messages"), "generation_prompt": p.tokens_of("generation"),
            "segments": [s.to_json() for s in p.segments], "dropped": list(p.dropped),
        }


def count_prompt(renderer, request: ChatRequest, *, window: int | None = None) -> PromptCount:
    """The rendered prompt's length and its breakdown by segment. `window`: a prompt whose length alone proves
    it cannot fit is refused (`ContextLengthExceeded`, "at least N tokens") instead of counted, as the daemon
    refuses it: counting a 50 MB prompt exactly takes minutes and gigabytes, and says no more than that."""
    rendered = renderer.render(request, window=window)
    total = len(rendered.token_ids)
    totals: dict[Label, int] = {}  # insertion order = the order labels first appear in the prompt
    for segment in map_segments(renderer, request, total).segments:
        totals[segment.label] = totals.get(segment.label, 0) + segment.tokens
    return PromptCount(total=total, segments=tuple(SegmentCount(label, n) for label, n in totals.items()),
                       dropped=rendered.dropped)


def count_tokens_file(path: str | Path, *, model: str | None = None,
                      fmt: RequestFormat | str | None = None) -> TokenCount:
    """Read `path`, render it for `model` (default: the daemon's model) and count. Raises `ZllmError`s."""
    request_file = read_request_file(path, fmt=fmt)
    inspected = resolve_model(model)
    prompt = count_prompt(load_renderer(inspected.path), request_file.request, window=inspected.context_length)
    return TokenCount(path=request_file.path, format=request_file.format, format_reason=request_file.reason,
                      model=inspected.name, context_length=inspected.context_length, prompt=prompt)
