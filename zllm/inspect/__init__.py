"""Offline inspection: what a request costs and why a request missed the prefix cache, without a daemon.

    count_tokens_file("prompt.json", model="smollm2")       → TokenCount (total + per-segment breakdown)
    explain_between_files("a.json", "b.json")                → MissExplanation (where, cause, windows)
    explain_near_miss(near_miss_record)                      → MissExplanation from a daemon record
    format_explanation(expl), format_count(count)            → rich Text for people

Request files are decoded by each API's own decoder and rendered by the daemon's renderer for the model
(`renderer.load_renderer`), and explained by the daemon's own analysis (zllm/diagnosis: segments, causes,
`explain_between`, `explain_near_miss`, re-exported here for the CLI), so counts and divergences are the daemon's
own.
"""

from zllm.diagnosis.causes import Cause, Diagnosis
from zllm.diagnosis.explain import MissExplanation, explain_between, explain_near_miss
from zllm.inspect.count_tokens import (
    PromptCount,
    TokenCount,
    count_prompt,
    count_tokens_file,
)
from zllm.inspect.display import format_count, format_explanation
from zllm.inspect.explain_miss import explain_between_files
from zllm.inspect.formats import (
    RequestFileError,
    RequestFormat,
    detect_format,
    read_request_file,
)
from zllm.inspect.renderer import load_renderer, resolve_model

__all__ = [
    "Cause", "Diagnosis", "MissExplanation", "PromptCount", "RequestFileError", "RequestFormat", "TokenCount",
    "count_prompt", "count_tokens_file", "detect_format", "explain_between", "explain_between_files",
    "explain_near_miss", "format_count", "format_explanation", "load_renderer", "read_request_file",
    "resolve_model",
]
