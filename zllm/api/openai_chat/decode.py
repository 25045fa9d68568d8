"""OpenAI Chat Completions request JSON → canonical `ChatRequest`.

    {"model": "smollm2", "stream": true, "stream_options": {"include_usage": true},
     "messages": [{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "ls?"}]},
                  {"role": "assistant", "content": null,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "sh", "arguments": "{\"cmd\":\"ls\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}],
     "tools": [{"type": "function", "function": {"name": "sh", "parameters": {…}}}],
     "tool_choice": "auto", "max_completion_tokens": 256, "temperature": 0, "stop": ["\\n\\n"],
     "prompt_cache_key": "<session id>"}

Validation errors are `InvalidRequest` naming the offending field in `param` (e.g. `messages[1].content`).
Unknown fields are ignored: agents send many vendor extensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from zllm.api.fields import (
    check_type,
    decode_model,
    json_type_name,
    optional,
    required,
    sampling_fields,
)
from zllm.api.openai_chat import wire
from zllm.api.output_options import decode_format, thinking_from_effort
from zllm.api.tool_fields import openai_choice_mode, openai_function_tool, openai_tool_call
from zllm.canonical import (
    ChatRequest,
    FunctionTool,
    Message,
    SamplingParams,
    ToolChoice,
)
from zllm.errors import InvalidRequest

API_NAME = "openai_chat"


@dataclass(frozen=True)
class ChatCall:
    """A decoded request plus the wire options that only the encoder cares about."""

    request: ChatRequest
    stream: bool
    include_usage: bool


def decode_chat_request(body: dict, *, request_id: str, namespace: str) -> ChatCall:
    _reject_unsupported(body)
    tools = _decode_tools(body.get("tools"))
    request = ChatRequest(
        id=request_id,
        model=decode_model(body),
        messages=_decode_messages(body),
        sampling=_decode_sampling(body),
        tools=tools,
        tool_choice=_decode_tool_choice(body.get("tool_choice"), has_tools=bool(tools)),
        namespace=namespace,
        api=API_NAME,
        # only a hint for which cached prefix to try first: always verified against the prompt tokens
        cache_hint=optional(body, "prompt_cache_key", "string") or None,
        thinking=thinking_from_effort(body.get("reasoning_effort"), "reasoning_effort"),
        reasoning_effort=body.get("reasoning_effort"),  # checked by thinking_from_effort
        response_format=decode_format(optional(body, "response_format", "object"), "response_format",
                                      nested_schema=True),
    )
    stream = bool(optional(body, "stream", "boolean"))
    stream_options = optional(body, "stream_options", "object") or {}
    include_usage = bool(optional(stream_options, "include_usage", "boolean", "stream_options.include_usage"))
    return ChatCall(request=request, stream=stream, include_usage=stream and include_usage)


def _reject_unsupported(body: dict) -> None:
    """Fail loudly on options we would otherwise silently not honour."""
    n = optional(body, "n", "integer")
    if n is not None and n != 1:
        raise InvalidRequest(f"`n` must be 1: zllm generates one choice per request, got {n}", param="n")
    if optional(body, "logprobs", "boolean"):
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise InvalidRequest("`functions`/`function_call` are deprecated; send `tools`/`tool_choice`",
                             param="functions")


# ----------------------------------------------------------------------------------------------------------
# messages


def _decode_messages(body: dict) -> tuple[Message, ...]:
    items = required(body, "messages", "array")
    if not items:
        raise InvalidRequest("`messages` must not be empty", param="messages")
    # tool call id → function name, so tool results can be named for templates that render the name
    call_names: dict[str, str] = {}
    return tuple(_decode_message(item, f"messages[{i}]", call_names) for i, item in enumerate(items))


def _decode_message(item: object, param: str, call_names: dict[str, str]) -> Message:
    item = check_type(item, "object", param)
    wire_role = required(item, "role", "string", f"{param}.role")
    role = wire.ROLES.get(wire_role)
    if role is None:
        allowed = ", ".join(wire.ROLES)
        raise InvalidRequest(f"`{param}.role` must be one of {allowed}; got {wire_role!r}", param=f"{param}.role")
    if role == "assistant":
        return _decode_assistant(item, param, call_names)
    if role == "tool":
        return _decode_tool_result(item, param, call_names)
    return Message(role=role, content=_decode_content(item, param, required_content=True))


def _decode_assistant(item: dict, param: str, call_names: dict[str, str]) -> Message:
    raw_calls = optional(item, "tool_calls", "array", f"{param}.tool_calls") or []
    calls = tuple(openai_tool_call(call, f"{param}.tool_calls[{j}]", j) for j, call in enumerate(raw_calls))
    call_names.update((call.id, call.name) for call in calls)
    reasoning = next((item[key] for key in wire.REASONING_ALIASES if isinstance(item.get(key), str)), None)
    return Message(
        role="assistant",
        content=_decode_content(item, param, required_content=False),
        tool_calls=calls,
        reasoning=reasoning or None,
    )


def _decode_tool_result(item: dict, param: str, call_names: dict[str, str]) -> Message:
    call_id = required(item, "tool_call_id", "string", f"{param}.tool_call_id")
    name = optional(item, "name", "string", f"{param}.name") or call_names.get(call_id)
    return Message(
        role="tool",
        content=_decode_content(item, param, required_content=True),
        tool_call_id=call_id,
        name=name,
    )


def _decode_content(item: dict, param: str, *, required_content: bool) -> str:
    param = f"{param}.content"
    content = item.get("content")
    if content is None:
        if required_content:
            raise InvalidRequest(f"missing required parameter `{param}`", param=param)
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"`{param}` must be a string or an array of content parts, got {json_type_name(content)}", param=param
        )
    return wire.PART_SEPARATOR.join(_decode_text_part(part, f"{param}[{j}]") for j, part in enumerate(content))


def _decode_text_part(part: object, param: str) -> str:
    part = check_type(part, "object", param)
    kind = required(part, "type", "string", f"{param}.type")
    if kind == wire.TEXT_PART:
        return required(part, "text", "string", f"{param}.text")
    if kind == wire.REFUSAL_PART:
        return required(part, "refusal", "string", f"{param}.refusal")
    if kind in wire.UNSUPPORTED_PARTS:
        what = wire.UNSUPPORTED_PARTS[kind]
        raise InvalidRequest(
            f"{what} content ({kind!r} parts) is not supported: zllm serves text-only models", param=f"{param}.type"
        )
    raise InvalidRequest(f"unknown content part type {kind!r}; expected 'text'", param=f"{param}.type")


# ----------------------------------------------------------------------------------------------------------
# tools


def _decode_tools(raw: object) -> tuple[FunctionTool, ...]:
    if raw is None:
        return ()
    items = check_type(raw, "array", "tools")
    return tuple(openai_function_tool(item, f"tools[{i}]") for i, item in enumerate(items))


def _decode_tool_choice(raw: object, *, has_tools: bool) -> ToolChoice:
    if raw is None:
        return ToolChoice()
    if isinstance(raw, str):
        return openai_choice_mode(raw, has_tools=has_tools, or_else="a function")
    choice = check_type(raw, "object", "tool_choice")
    if choice.get("type") != wire.FUNCTION_TOOL:
        raise InvalidRequest(f"`tool_choice.type` must be 'function', got {choice.get('type')!r}",
                             param="tool_choice.type")
    function = required(choice, "function", "object", "tool_choice.function")
    return ToolChoice(mode="tool", name=required(function, "name", "string", "tool_choice.function.name"))


# ----------------------------------------------------------------------------------------------------------
# sampling


def _decode_sampling(body: dict) -> SamplingParams:
    return SamplingParams(
        **sampling_fields(body, "temperature", "top_p", "top_k"),
        seed=optional(body, "seed", "integer"),
        max_tokens=_decode_max_tokens(body),
        stop=_decode_stop(body.get("stop")),
    )


def _decode_max_tokens(body: dict) -> int | None:
    # max_completion_tokens is the current name; max_tokens the deprecated one still sent by most clients
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = optional(body, key, "integer")
    if value is not None and value < 1:
        raise InvalidRequest(f"`{key}` must be at least 1, got {value}", param=key)
    return value


def _decode_stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    items = check_type(raw, "array", "stop")
    return tuple(check_type(item, "string", f"stop[{i}]") for i, item in enumerate(items))
