"""Ollama wire names: what the `/api/*` routes accept and answer with (Ollama's docs/api.md).

Requests decoded (decode.py); every other field is accepted and ignored:

    /api/chat      model, messages[{role, content, thinking, tool_calls, tool_name, images}], tools, format,
                   options, think, stream (default true), keep_alive
    /api/generate  model, prompt, system, format, options, think, stream, keep_alive
                   (raw, suffix, template, context, images: refused, see decode.py)
    options        temperature, top_p, top_k, seed, num_predict, stop, num_ctx (accepted: the window is the
                   daemon's); the rest (repeat_penalty, mirostat, num_gpu, ...) ignored as Ollama-internal

Streaming answers are NDJSON (one JSON object per line); the last one has `"done": true` and the timings.
"""

from __future__ import annotations

from zllm.canonical import FinishReason

# Ollama's API level zllm speaks. Codex `--oss --local-provider ollama` refuses servers older than 0.13.4.
API_VERSION = "0.13.5"

NDJSON = "application/x-ndjson"

# wire role → canonical role
ROLES = ("system", "user", "assistant", "tool")

# `format`: "json" (any JSON object), "" (none), or a JSON schema object
JSON_FORMAT = "json"

# options.num_predict: -1 = no limit, -2 = fill the context; both mean "up to the window" here
UNLIMITED_PREDICT = (-1, -2)

# `think` levels (gpt-oss style); any of them turns reasoning on
THINK_LEVELS = ("low", "medium", "high")

# Ollama names tags; a name without one means ":latest", so "m:latest" is "m"
DEFAULT_TAG = ":latest"

# done_reason values. "load": a request with no prompt only loads the model (clients preload with it).
LOAD = "load"
DONE_REASONS: dict[FinishReason, str] = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.TOOL_CALLS: "stop",
    FinishReason.LENGTH: "length",
    # not an Ollama value: the loop guard stopped a generation stuck repeating itself (as on the other APIs)
    FinishReason.REPETITION: "repetition",
    # Ollama has no prefill-only request (its empty-prompt preload runs nothing: LOAD); for a total table
    FinishReason.PREFILLED: "length",
}
