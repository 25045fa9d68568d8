"""A request file on disk → its wire format → the canonical `ChatRequest` the daemon would build from it.

Three wire formats, told apart by their keys (`--format` overrides the guess):

    Responses           {"model": …, "input": "hi" | [items…], "instructions": …}
    Anthropic Messages  {"model": …, "max_tokens": 32000, "system": [{"type": "text", …}],
                         "messages": [{"role": "user", "content": [{"type": "tool_result", …}]}],
                         "tools": [{"name": …, "input_schema": {…}}]}
    Chat Completions    {"model": …, "messages": [{"role": "developer" | "tool", "tool_calls": […]}],
                         "tools": [{"type": "function", "function": {…}}], "max_completion_tokens": …}

A recorded exchange (`{"method": "POST", "path": "/v1/messages", "body": {…}}`, the shape of the client
captures in CLIENTS.md) is unwrapped, and its path decides the format. Both Messages shapes carry
`messages`; a body with no field only one of the two APIs has is read as Chat Completions, except that a
bare `max_tokens` (required by Anthropic, deprecated by OpenAI) tips it to Anthropic.

Decoding goes through each API's own decoder, so the canonical request is exactly the daemon's. A Responses
body that continues `previous_response_id` cannot be rebuilt offline: the stored chain lives in the daemon.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from zllm.canonical import ChatRequest
from zllm.errors import InvalidRequest

OFFLINE_REQUEST_ID = "offline"


class RequestFileError(InvalidRequest):
    """A request file that cannot be read, parsed or recognised."""

    code = "invalid_request_file"


class RequestFormat(str, Enum):
    CHAT = "chat"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"

    @property
    def label(self) -> str:
        return {"chat": "Chat Completions", "responses": "Responses", "anthropic": "Anthropic Messages"}[self.value]


# what `--format` accepts
FORMAT_ALIASES: dict[str, RequestFormat] = {
    "chat": RequestFormat.CHAT, "chat-completions": RequestFormat.CHAT, "openai": RequestFormat.CHAT,
    "responses": RequestFormat.RESPONSES,
    "anthropic": RequestFormat.ANTHROPIC, "messages": RequestFormat.ANTHROPIC,
}

# fields that only one of the two `messages` APIs has
_ANTHROPIC_FIELDS = ("system", "stop_sequences", "top_k", "thinking", "anthropic_version", "context_management",
                     "output_config")
_CHAT_FIELDS = ("max_completion_tokens", "stream_options", "response_format", "n", "frequency_penalty",
                "presence_penalty", "logprobs", "logit_bias", "seed", "reasoning_effort", "stop", "prompt_cache_key")
_ANTHROPIC_BLOCKS = {"tool_use", "tool_result", "thinking", "redacted_thinking", "document", "tool_reference"}
_CHAT_ROLES = {"tool", "developer", "function"}

# a captured exchange's path → its format (most specific first: /v1/messages also prefixes count_tokens)
_PATHS = (("/responses", RequestFormat.RESPONSES), ("/chat/completions", RequestFormat.CHAT),
          ("/messages", RequestFormat.ANTHROPIC))


@dataclass(frozen=True)
class RequestFile:
    path: Path
    format: RequestFormat
    reason: str  # why this format: "--format", "path /v1/messages", "top-level `system`", …
    body: dict
    request: ChatRequest


def parse_format(name: str) -> RequestFormat:
    try:
        return FORMAT_ALIASES[name.strip().lower()]
    except KeyError:
        raise RequestFileError(f"unknown request format `{name}`",
                               hint="use one of: chat, responses, anthropic") from None


def read_request_file(path: str | Path, *, fmt: RequestFormat | str | None = None) -> RequestFile:
    """Read, recognise and decode `path` (a request body, or a captured exchange holding one)."""
    path = Path(path)
    document = _load_json(path)
    body, path_format = _unwrap_capture(document)
    if fmt is not None:
        fmt, reason = (parse_format(fmt) if isinstance(fmt, str) else fmt), "--format"
    elif path_format is not None:
        fmt, reason = path_format, f"path {document.get('path')}"
    else:
        fmt, reason = detect_format(body)
    try:
        request = decode_body(body, fmt)
    except RequestFileError:
        raise
    except InvalidRequest as exc:
        raise RequestFileError(f"{path} is not a valid {fmt.label} request: {exc.message}",
                               hint=exc.hint or _format_hint(fmt, reason)) from None
    return RequestFile(path=path, format=fmt, reason=reason, body=body, request=request)


def detect_format(body: dict) -> tuple[RequestFormat, str]:
    """(format, the key that decided it) for a request body; `RequestFileError` when it is none of the three."""
    has_messages, has_input = "messages" in body, "input" in body or "instructions" in body
    if has_input and not has_messages:
        return RequestFormat.RESPONSES, "`input`" if "input" in body else "`instructions`"
    if has_input and has_messages:
        raise RequestFileError("the request has both `messages` and `input`: cannot tell its format",
                               hint="say which with --format chat|responses|anthropic")
    if not has_messages:
        raise RequestFileError("not a Chat Completions, Responses or Anthropic Messages request "
                               "(no `messages` and no `input`)",
                               hint="pass a request body, or force a format with --format")
    anthropic, chat = _anthropic_clues(body), _chat_clues(body)
    if len(anthropic) > len(chat):
        return RequestFormat.ANTHROPIC, anthropic[0]
    if len(chat) > len(anthropic):
        return RequestFormat.CHAT, chat[0]
    if "max_tokens" in body and not chat:
        return RequestFormat.ANTHROPIC, "`max_tokens` with no OpenAI-only field"
    return RequestFormat.CHAT, "`messages` with no Anthropic-only field"


def decode_body(body: dict, fmt: RequestFormat) -> ChatRequest:
    """The canonical request the daemon's route for `fmt` would build (no namespace: that comes from a key)."""
    # imported here: the decoders pull in the API package, which `zllm --help` should not pay for
    if fmt is RequestFormat.CHAT:
        from zllm.api.openai_chat.decode import decode_chat_request

        return decode_chat_request(body, request_id=OFFLINE_REQUEST_ID, namespace="").request
    if fmt is RequestFormat.ANTHROPIC:
        from zllm.api.anthropic_messages.decode import decode_count_tokens_request

        # count_tokens decoding is generation decoding minus the required max_tokens: the same prompt
        return decode_count_tokens_request(body, request_id=OFFLINE_REQUEST_ID, namespace="")
    return _decode_responses(body)


def _decode_responses(body: dict) -> ChatRequest:
    from zllm.api.openai_responses.decode import (
        chat_request,
        decode_responses_request,
        plan_turn,
    )

    call = decode_responses_request(body)
    if call.previous_response_id:
        raise RequestFileError(
            f"the request continues `previous_response_id` {call.previous_response_id}, "
            "whose conversation only the daemon has",
            hint="send the whole conversation in `input` (as Codex does over HTTP)")
    return chat_request(call, plan_turn(call, None), request_id=OFFLINE_REQUEST_ID, namespace="")


def _load_json(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RequestFileError(f"no such file: {path}", hint="pass the path of a JSON request body") from None
    except OSError as exc:
        raise RequestFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestFileError(f"{path} is not valid JSON: {exc}",
                               hint="the file must hold one JSON request body") from None
    if not isinstance(document, dict):
        raise RequestFileError(f"{path} holds a JSON {type(document).__name__}, not a request object",
                               hint="the file must hold one JSON request body (an object)")
    return document


def _unwrap_capture(document: dict) -> tuple[dict, RequestFormat | None]:
    """A captured exchange's body and the format its path names; a plain body as it is."""
    body, path = document.get("body"), document.get("path")
    if not (isinstance(body, dict) and isinstance(path, str)):
        return document, None
    route = path.split("?", 1)[0]
    for suffix, fmt in _PATHS:
        if suffix in route:
            return body, fmt
    return body, None


def _anthropic_clues(body: dict) -> list[str]:
    clues = [f"top-level `{name}`" for name in _ANTHROPIC_FIELDS if name in body]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    if any(isinstance(t, dict) and "input_schema" in t for t in tools):
        clues.append("tools with `input_schema`")
    if any(_block_types(m) & _ANTHROPIC_BLOCKS for m in _messages(body)):
        clues.append("tool_use / tool_result / thinking blocks")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"):
        clues.append("an Anthropic `tool_choice`")
    return clues


def _chat_clues(body: dict) -> list[str]:
    clues = [f"top-level `{name}`" for name in _CHAT_FIELDS if name in body]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    if any(isinstance(t, dict) and "function" in t for t in tools):
        clues.append("tools with `function`")
    messages = _messages(body)
    if any(m.get("role") in _CHAT_ROLES for m in messages):
        clues.append("`tool` / `developer` messages")
    if any("tool_calls" in m or "tool_call_id" in m for m in messages):
        clues.append("`tool_calls`")
    return clues


def _messages(body: dict) -> list[dict]:
    items = body.get("messages")
    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def _block_types(message: dict) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {block.get("type") for block in content if isinstance(block, dict)}


def _format_hint(fmt: RequestFormat, reason: str) -> str:
    if reason == "--format":
        return "check the file against that API's request shape"
    return f"read as {fmt.label} because of {reason}; force another with --format"
