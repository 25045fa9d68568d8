"""Anthropic Messages wire names: what `POST /v1/messages` accepts and what it answers with.

Request fields decoded (decode.py, conversation.py, tools.py); every other field is accepted and ignored
(Claude Code sends `output_config`, `metadata.user_id` as a JSON string, `safeguards`,
`cache_control` on any block, and betas we do not implement):

    model, max_tokens (required except for count_tokens), messages, system, tools, tool_choice,
    stop_sequences, temperature, top_p, top_k, stream, thinking (accepted, ignored: see decode.py),
    context_management (context_management.py)

Content blocks, by where they may appear:

    system / role "system":  text
    user:                     text, tool_result (content: string or [text | tool_reference])
    assistant:                text, thinking (+ signature), redacted_thinking, tool_use, compaction

Streaming answers are SSE frames that carry an `event:` line naming the `type` of their data
(the Python SDK silently yields nothing without them; Claude Code falls back to `stream:false`).
"""

from __future__ import annotations

from zllm.canonical import FinishReason

MESSAGE = "message"
ASSISTANT = "assistant"

# wire role → canonical role; "system" in `messages` is Claude Code's mid-conversation system turn
ROLES: dict[str, str] = {"user": "user", "assistant": "assistant", "system": "system"}

TEXT = "text"
THINKING = "thinking"
REDACTED_THINKING = "redacted_thinking"
TOOL_USE = "tool_use"
TOOL_RESULT = "tool_result"
# a client-side tool search answers with these; the named (deferred) tool is then loaded (see tools.py)
TOOL_REFERENCE = "tool_reference"
# the summary a `compact_20260112` edit wrote (compaction.py): everything before it is dropped when it comes back
COMPACTION = "compaction"

# block types we recognise but cannot serve → a clear 400 instead of "unknown block type"
UNSUPPORTED_BLOCKS: dict[str, str] = {
    "image": "image",
    "document": "document",
    "search_result": "search result",
    "container_upload": "file upload",
    "server_tool_use": "server tool",
    "web_search_tool_result": "server tool",
    "web_fetch_tool_result": "server tool",
    "code_execution_tool_result": "server tool",
}

# Text blocks of one user/system/tool_result message are separate inputs: joined like OpenAI Chat content
# parts (openai_chat.wire.PART_SEPARATOR), so one conversation renders the same through every API.
BLOCK_SEPARATOR = "\n"
# Text (and thinking) blocks of one assistant message are pieces of one model output that the encoder split
# around thinking/tool_use blocks: concatenated back, they are what the model wrote (and what OpenAI Chat
# returned as `content` for the same generation).
ASSISTANT_SEPARATOR = ""


# An errored tool result (`is_error: true`) is shown to the model as "Error: <content>" (just "Error" when
# empty): chat templates have no is_error flag, and OpenAI-style tool results have none either.
TOOL_ERROR_LABEL = "Error"

# A tool with no `type`, or type "custom", is a client tool we serve; any other type ("bash_20250124",
# "web_search_20250305") is an Anthropic-defined tool without `input_schema`, which we cannot describe.
CUSTOM_TOOL = "custom"

# tool_choice.type → canonical ToolChoice.mode
TOOL_CHOICE_MODES: dict[str, str] = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}

# ABORT has no wire name: an aborted stream just ends; ERROR is an `error` event instead.
STOP_REASONS: dict[FinishReason, str] = {
    FinishReason.STOP: "end_turn",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
    # not an Anthropic value: the loop guard stopped a generation stuck repeating itself (a paused compaction's
    # "compaction" has no canonical finish reason: compaction.py answers it without the engine)
    FinishReason.REPETITION: "repetition",
    # `max_tokens: 0` (a cache prewarm) reached its budget of no output tokens
    FinishReason.PREFILLED: "max_tokens",
}

# the header every Anthropic client sends (any value): how the shared /v1/models route tells them apart
VERSION_HEADER = "anthropic-version"
