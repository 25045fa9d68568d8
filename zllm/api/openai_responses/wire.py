"""OpenAI Responses wire names: what `POST /v1/responses` (and its WebSocket) accepts and answers with.

Request fields decoded (decode.py); every other field is accepted and ignored (Codex sends `client_metadata`,
`prompt_cache_key`, `text.verbosity`, `reasoning.context`, ...):

    model, input, instructions, tools, tool_choice, parallel_tool_calls, max_output_tokens, temperature,
    top_p, stream, store, include, previous_response_id, text.format (type "text" only for now),
    reasoning, metadata, user, prompt_cache_key, truncation, generate (WebSocket warm-up: runs nothing),
    prompt_cache_options (comparison_response_id, prewarm: a prefill-only request)

Input items: message (roles developer/system/user/assistant), reasoning, function_call(+_output),
custom_tool_call(+_output), additional_tools, compaction (zllm's own, see compaction_seal.py) and a final
compaction_trigger (this turn writes one). Tools: function, namespace, custom; hosted tools are skipped.
"""

from __future__ import annotations

from zllm.canonical import FinishReason

RESPONSE = "response"

# wire role → canonical role
ROLES: dict[str, str] = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}

# message content parts that carry text (input_text from clients, output_text echoed from our output)
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
REFUSAL_PART = "refusal"
UNSUPPORTED_PARTS: dict[str, str] = {"input_image": "image", "input_file": "file", "input_audio": "audio"}
# several text parts of one message or tool output are joined with this (as openai_chat does)
PART_SEPARATOR = "\n"

# input item types
MESSAGE = "message"
REASONING = "reasoning"
FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
CUSTOM_TOOL_CALL = "custom_tool_call"
CUSTOM_TOOL_CALL_OUTPUT = "custom_tool_call_output"
ADDITIONAL_TOOLS = "additional_tools"
ITEM_REFERENCE = "item_reference"

# tool types
FUNCTION_TOOL = "function"
NAMESPACE_TOOL = "namespace"
CUSTOM_TOOL = "custom"
# tools OpenAI runs on its own servers (or clients run for OpenAI-only models): a local model has no use
# for them, so they are left out (with a log line) instead of failing the request
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "tool_search", "image_generation", "local_shell", "shell", "apply_patch", "file_search",
    "code_interpreter", "computer_use_preview", "computer", "mcp",
})

# `namespace.tool`: "." is not allowed in OpenAI tool names, so a qualified name never collides with a
# plain one
NAMESPACE_SEPARATOR = "."
# the one argument a custom (freeform) tool takes when exposed as a canonical function tool
CUSTOM_INPUT = "input"


INCLUDE_ENCRYPTED_REASONING = "reasoning.encrypted_content"
# our `encrypted_content`: not encryption (the daemon is local) but an opaque, exact copy of the reasoning
ENCRYPTED_REASONING_PREFIX = "zllm.r1."

TEXT_FORMAT = "text"

# How a finished stream ends on the wire: status, terminal event, incomplete_details.reason.
STATUS_COMPLETED = "completed"
STATUS_INCOMPLETE = "incomplete"
STATUS_FAILED = "failed"
STATUS_IN_PROGRESS = "in_progress"
STATUS_CANCELLED = "cancelled"
FINISH_STATUS: dict[FinishReason, str] = {
    FinishReason.STOP: STATUS_COMPLETED,
    FinishReason.STOP_SEQUENCE: STATUS_COMPLETED,
    FinishReason.TOOL_CALLS: STATUS_COMPLETED,
    FinishReason.LENGTH: STATUS_INCOMPLETE,
    FinishReason.REPETITION: STATUS_INCOMPLETE,
    FinishReason.ERROR: STATUS_FAILED,
    FinishReason.PREFILLED: STATUS_COMPLETED,  # `prompt_cache_options.prewarm`: done, with no output
    FinishReason.ABORT: STATUS_CANCELLED,  # only after `POST /v1/responses/{id}/cancel` (encode.py)
}
TERMINAL_EVENTS: dict[str, str] = {
    STATUS_COMPLETED: "response.completed",
    STATUS_INCOMPLETE: "response.incomplete",
    STATUS_FAILED: "response.failed",
    # OpenAI's stream has no `response.cancelled` event, and the SDKs end a response (stream accumulator,
    # WebSocket session) only at completed / failed / incomplete: a cancelled response ends with
    # `response.incomplete` whose `response.status` is "cancelled" (incomplete_details stays null)
    STATUS_CANCELLED: "response.incomplete",
}
INCOMPLETE_MAX_OUTPUT_TOKENS = "max_output_tokens"
# not an OpenAI value: the loop guard stopped a generation stuck repeating itself
INCOMPLETE_REPETITION = "repetition"
INCOMPLETE_REASONS: dict[FinishReason, str] = {
    FinishReason.LENGTH: INCOMPLETE_MAX_OUTPUT_TOKENS,
    FinishReason.REPETITION: INCOMPLETE_REPETITION,
}

# zllm error code → `response.error.code` of a failed response; others pass through unchanged
# (context_length_exceeded must: Codex matches on it)
FAILED_CODES: dict[str, str] = {
    "engine_error": "server_error",
    "internal_error": "server_error",
    "overloaded": "server_error",
}

# id prefixes, as OpenAI mints them
RESPONSE_ID = "resp"
MESSAGE_ID = "msg"
REASONING_ID = "rs"
FUNCTION_CALL_ID = "fc"
CUSTOM_TOOL_CALL_ID = "ctc"
# (a call's call_id is the core's id: api/call_ids.py)

# WebSocket client frames
WS_CREATE = "response.create"
# Codex's incremental turn: only the new items, continuing the stream's last response with its settings
WS_APPEND = "response.append"
# Codex's acknowledgement that it has handled a response (nothing to answer)
WS_PROCESSED = "response.processed"
WS_CANCEL = "response.cancel"
# mid-turn input for the running response; refused with WS_STEER_FAILED (see websocket_frames.py)
WS_STEER = "response.steer"
WS_STEER_FAILED = "response.steer.failed"
# names a lane of a multiplexed socket; echoed on every frame of that lane
WS_STREAM_ID = "stream_id"
