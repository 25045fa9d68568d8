"""The model catalog Codex reads for a model it does not know: without it
Codex warns "Model metadata for `…` not found. Defaulting to fallback metadata", guesses the window, and
sends a prompt built for OpenAI's models.

    {"models": [{"slug": "qwen3-8b", "context_window": 32768, "auto_compact_token_limit": 26214,
                 "shell_type": "shell_command", "apply_patch_tool_type": "freeform", "use_responses_lite": false,
                 "input_modalities": ["text"], "base_instructions": "You are a coding agent …", …}]}

Codex reads it from `GET /v1/models?client_version=…` (meta_routes.py; Codex 0.171 asks a custom provider
only when its key comes from a command, `[model_providers.X.auth]`) and from the file `zllm codex` writes
(`model_catalog_json`, zllm/cli/codex_catalog.py): both are built here. One entry per model, in the shape of
Codex's `ModelInfo` (codex-rs/protocol openai_models.rs). Codex ignores fields it does not know (so one body
can carry both this and the OpenAI list) but refuses the whole catalog on a value it does not know (0.171
knows only `freeform` for `apply_patch_tool_type`). Checked with Codex 0.171.0 against `zllm serve`: the
fallback warning is gone, and its first request is much shorter (it no longer carries the instructions written
for OpenAI's models). What it tells Codex, and why:

* the real window, and when to compact: at `COMPACT_AT` of it, leaving room for the summary zllm writes;
* tools a small model can call: a shell, `apply_patch` as a freeform tool (zllm offers it to the model as
  a function with one string argument), no code mode, no hosted search; `use_responses_lite: false`, so
  the tools come in the request's `tools`, not as `additional_tools` items;
* text only (Codex then never attaches images), no reasoning summaries or verbosity parameter;
* tool output truncated to a share of the window, and short base instructions instead of the long ones
  written for OpenAI's models (which alone fill a quarter of an 8K window).
"""

from __future__ import annotations

COMPACT_AT = 0.8
# tool output Codex keeps per call: an eighth of the window, within what Codex itself allows
TRUNCATE_SHARE, TRUNCATE_MIN, TRUNCATE_MAX = 8, 256, 10_000
BASE_INSTRUCTIONS = """\
You are a coding agent running in Codex on the user's computer, served by a local model. You and the user \
share one workspace. Read files and run commands with the shell tool, edit files with apply_patch, and keep \
changes small and focused. Do not undo changes you did not make. Run the tests that cover what you changed \
when there are any. When you are done, say in a few lines what you changed and why; name files by path."""


def catalog_entry(model: str, context_length: int | None) -> dict:
    entry = {
        "slug": model,
        "display_name": model,
        "description": "served locally by zllm",
        "supported_reasoning_levels": [],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
        "availability_nux": None,
        "upgrade": None,
        "base_instructions": BASE_INSTRUCTIONS,
        "model_messages": None,
        "include_skills_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "include_apps_usage_instructions": False,
        "supports_reasoning_summaries": False,
        "supports_reasoning_summary_parameter": False,
        "default_reasoning_summary": "none",
        "reasoning_summary_format": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "tokens", "limit": truncation_limit(context_length)},
        "supports_parallel_tool_calls": False,
        "supports_image_detail_original": False,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
        "supports_search_tool": False,
        "use_responses_lite": False,
        "node_repl_disabled": True,
        "multi_agent_version": None,
        "multi_agent_reasoning_effort": None,
        "tool_mode": None,
        "auto_review_model_override": None,
    }
    if context_length:
        entry.update(context_window=context_length, max_context_window=context_length,
                     auto_compact_token_limit=auto_compact_limit(context_length))
    return entry


def auto_compact_limit(context_length: int) -> int:
    return int(context_length * COMPACT_AT)


def truncation_limit(context_length: int | None) -> int:
    if not context_length:
        return TRUNCATE_MAX
    return max(TRUNCATE_MIN, min(TRUNCATE_MAX, context_length // TRUNCATE_SHARE))


def codex_models(models: list[tuple[str, int | None]]) -> dict:
    """Codex's `ModelsResponse`: `{"models": [ModelInfo, …]}` for (model id, context window) pairs."""
    return {"models": [catalog_entry(model, context_length) for model, context_length in models]}
