"""`zllm cache explain-miss --between A.json B.json`, offline: two request files read in their own formats and
rendered for one stored model, then explained by the daemon's own analysis (zllm/diagnosis/explain.py)."""

from __future__ import annotations

from pathlib import Path

from zllm.diagnosis.explain import MissExplanation, explain_between
from zllm.inspect.formats import RequestFormat, read_request_file
from zllm.inspect.renderer import load_renderer, resolve_model


def explain_between_files(a_path: str | Path, b_path: str | Path, *, model: str | None = None,
                          fmt_a: RequestFormat | str | None = None,
                          fmt_b: RequestFormat | str | None = None) -> MissExplanation:
    """Offline: A.json was cached, B.json came next; both rendered for `model` (default: the daemon's)."""
    a = read_request_file(a_path, fmt=fmt_a).request
    b = read_request_file(b_path, fmt=fmt_b).request
    renderer = load_renderer(resolve_model(model).path)
    return explain_between(a, b, renderer)
