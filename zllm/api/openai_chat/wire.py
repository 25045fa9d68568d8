"""OpenAI Chat Completions wire names: what `POST /v1/chat/completions` accepts and what it answers with.

Request fields decoded (decode.py); every other field is accepted and ignored:

    model, messages, tools, tool_choice, max_tokens, max_completion_tokens, temperature, top_p,
    top_k (extension), seed, stop, n (1 only), stream, stream_options.include_usage, response_format
    (type "text" only), logprobs (false only), user, parallel_tool_calls, reasoning_effort,
    prompt_cache_key (→ the canonical cache_hint)

Message content is a string or an array of `{"type": "text", "text": …}` parts; an assistant may also
echo its reasoning as `reasoning_content` (DeepSeek/vLLM convention, also how zllm streams it back).
"""

from __future__ import annotations

from zllm.canonical import FinishReason

CHAT_COMPLETION = "chat.completion"
CHAT_COMPLETION_CHUNK = "chat.completion.chunk"

# wire role → canonical role ("developer" is the newer name OpenAI gives the system prompt)
ROLES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}

TEXT_PART = "text"
# assistant messages may echo a refusal part; it is text the model produced
REFUSAL_PART = "refusal"
# content part types we recognise but cannot serve (text-only models) → a clear 400, not "unknown type"
UNSUPPORTED_PARTS: dict[str, str] = {
    "image_url": "image",
    "input_image": "image",
    "input_audio": "audio",
    "file": "file",
}
# multiple text parts are joined with this, as vLLM does, so one conversation always renders the same way
PART_SEPARATOR = "\n"

FUNCTION_TOOL = "function"

# non-standard field carrying reasoning text in deltas, messages and assistant history
REASONING_FIELD = "reasoning_content"
REASONING_ALIASES = ("reasoning_content", "reasoning")

# ABORT has no wire name: an aborted stream just ends; ERROR is sent as an error frame instead.
FINISH_REASONS: dict[FinishReason, str] = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
    # not an OpenAI value: the loop guard stopped a generation stuck repeating itself (distinct on purpose,
    # so a client can tell it from a natural stop)
    FinishReason.REPETITION: "repetition",
    # Chat has no prefill-only request; mapped so that the table covers every reason
    FinishReason.PREFILLED: "length",
}

DONE = "[DONE]"
