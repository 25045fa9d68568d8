"""Ollama request JSON (`/api/chat`, `/api/generate`) → canonical `ChatRequest`.

    {"model": "qwen2.5-coder", "stream": false, "think": false, "format": "json",
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "paris"}}}]},
                  {"role": "tool", "tool_name": "get_weather", "content": "sunny"}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {…}}}],
     "options": {"temperature": 0, "num_predict": 64, "stop": ["\\n\\n"], "seed": 1, "num_ctx": 8192}}

Tool schemas get their usual key order back (`_conventional_order`). Tool calls carry `arguments` as an
object; they are serialized compactly, as the Chat Completions decoder does for the object form, so one
conversation renders to the same tokens (and prefix-cache entries) through either API. A tool result without
a call id answers the oldest call of the turn not yet answered. Errors are `InvalidRequest` naming the field,
answered as `{"error": "..."}`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zllm.api.fields import check_type, decode_model, optional, required, sampling_fields
from zllm.api.ollama import wire
from zllm.api.output_options import ANY_JSON_OBJECT, JSON_OBJECT
from zllm.api.tool_fields import openai_function_tool, openai_tool_call
from zllm.canonical import (
    ChatRequest,
    FunctionTool,
    Message,
    ResponseFormat,
    SamplingParams,
    ToolCall,
)
from zllm.errors import InvalidRequest

API_NAME = "ollama"


@dataclass(frozen=True)
class OllamaCall:
    """A decoded request. `request` is None for a request with nothing to generate (a preload)."""

    model: str
    request: ChatRequest | None
    stream: bool


def decode_chat(body: dict, *, request_id: str, namespace: str) -> OllamaCall:
    model = decode_model(body)
    items = optional(body, "messages", "array") or []
    messages = _decode_messages(items)
    return _call(body, model, messages, request_id=request_id, namespace=namespace,
                 tools=_decode_tools(body.get("tools")))


def decode_generate(body: dict, *, request_id: str, namespace: str) -> OllamaCall:
    model = decode_model(body)
    _reject_generate_extras(body)
    prompt = optional(body, "prompt", "string") or ""
    system = optional(body, "system", "string") or ""
    messages: list[Message] = []
    if prompt:
        if system:
            messages.append(Message(role="system", content=system))
        messages.append(Message(role="user", content=prompt))
    return _call(body, model, tuple(messages), request_id=request_id, namespace=namespace, tools=())


def _call(body: dict, model: str, messages: tuple[Message, ...], *, request_id: str, namespace: str,
          tools: tuple[FunctionTool, ...]) -> OllamaCall:
    stream = optional(body, "stream", "boolean")
    stream = True if stream is None else stream  # Ollama streams unless told not to
    # options and format are checked even for a preload: a bad request fails the same way with or without a prompt
    sampling = _decode_options(optional(body, "options", "object") or {})
    response_format = _decode_format(body.get("format"))
    thinking = _decode_think(body.get("think"))
    if not messages:
        return OllamaCall(model=model, request=None, stream=stream)
    request = ChatRequest(
        id=request_id,
        model=model,
        messages=messages,
        sampling=sampling,
        tools=tools,
        namespace=namespace,
        api=API_NAME,
        thinking=thinking,
        response_format=response_format,
        # `think: "high"` (Ollama's levels for gpt-oss) is a reasoning effort
        reasoning_effort=body.get("think") if isinstance(body.get("think"), str) else None,
    )
    return OllamaCall(model=model, request=request, stream=stream)


def _reject_generate_extras(body: dict) -> None:
    """What /api/generate can ask for that zllm's chat-template rendering cannot honour: refuse, never ignore."""
    if optional(body, "raw", "boolean"):
        raise InvalidRequest("`raw` prompts are not supported: zllm always renders the model's chat template; "
                             "send the text as `prompt` without `raw`", param="raw")
    if optional(body, "suffix", "string"):
        raise InvalidRequest("`suffix` (fill-in-the-middle) is not supported", param="suffix")
    if optional(body, "template", "string"):
        raise InvalidRequest("`template` overrides are not supported: zllm renders the model's own template",
                             param="template")
    if optional(body, "context", "array"):
        raise InvalidRequest("`context` (deprecated) is not supported: send the conversation to /api/chat",
                             param="context")
    _reject_images(body, "images")


def _reject_images(obj: dict, param: str) -> None:
    if optional(obj, "images", "array", param):
        raise InvalidRequest(f"`{param}`: image input is not supported: zllm serves text-only models", param=param)


# ----------------------------------------------------------------------------------------------------------
# messages


def _decode_messages(items: list) -> tuple[Message, ...]:
    pending_calls: list[ToolCall] = []  # the latest assistant turn's calls not yet answered, oldest first
    messages = []
    for i, item in enumerate(items):
        messages.append(_decode_message(item, f"messages[{i}]", pending_calls))
    return tuple(messages)


def _decode_message(item: object, param: str, pending_calls: list[ToolCall]) -> Message:
    item = check_type(item, "object", param)
    role = required(item, "role", "string", f"{param}.role")
    if role not in wire.ROLES:
        raise InvalidRequest(f"`{param}.role` must be one of {', '.join(wire.ROLES)}; got {role!r}",
                             param=f"{param}.role")
    _reject_images(item, f"{param}.images")
    content = optional(item, "content", "string", f"{param}.content") or ""
    if role == "assistant":
        calls = _decode_tool_calls(item, param)
        pending_calls[:] = calls
        thinking = optional(item, "thinking", "string", f"{param}.thinking")
        return Message(role="assistant", content=content, tool_calls=calls, reasoning=thinking or None)
    if role == "tool":
        return _decode_tool_result(item, param, content, pending_calls)
    return Message(role=role, content=content)


def _decode_tool_calls(item: dict, param: str) -> tuple[ToolCall, ...]:
    raw = optional(item, "tool_calls", "array", f"{param}.tool_calls") or []
    return tuple(openai_tool_call(call, f"{param}.tool_calls[{j}]", j, check_kind=False)
                 for j, call in enumerate(raw))


def _decode_tool_result(item: dict, param: str, content: str, pending_calls: list[ToolCall]) -> Message:
    call_id = optional(item, "tool_call_id", "string", f"{param}.tool_call_id")
    name = optional(item, "tool_name", "string", f"{param}.tool_name") or optional(item, "name", "string",
                                                                                    f"{param}.name")
    answered = next((c for c in pending_calls if c.id == call_id), None) if call_id else None
    if answered is None and call_id is None and pending_calls:
        answered = pending_calls[0]
    if answered is not None:
        pending_calls.remove(answered)
    return Message(role="tool", content=content,
                   tool_call_id=call_id or (answered.id if answered else None),
                   name=name or (answered.name if answered else None))


# ----------------------------------------------------------------------------------------------------------
# tools


def _decode_tools(raw: object) -> tuple[FunctionTool, ...]:
    if raw is None:
        return ()
    items = check_type(raw, "array", "tools")
    return tuple(_decode_tool(item, f"tools[{i}]") for i, item in enumerate(items))


def _decode_tool(item: object, param: str) -> FunctionTool:
    tool = openai_function_tool(item, param, type_required=False)
    return replace(tool, parameters=_conventional_order(tool.parameters))


def _conventional_order(schema: dict) -> dict:
    """The schema with `type`, `properties`, `required` first, as OpenAI-style clients write it.

    Key order reaches the rendered prompt, and Ollama clients cannot choose it: the ollama package (and
    Ollama itself, decoding into its Go struct) send `type, $defs, items, required, properties`. Putting it back
    in the usual order lets the same tools hit the same prefix-cache entries as through Chat Completions.
    """
    first = [key for key in _SCHEMA_KEY_ORDER if key in schema]
    return {**{key: schema[key] for key in first}, **{k: v for k, v in schema.items() if k not in first}}


_SCHEMA_KEY_ORDER = ("type", "properties", "required")


# ----------------------------------------------------------------------------------------------------------
# options, format, think


def _decode_options(options: dict) -> SamplingParams:
    def field(name: str) -> str:
        return f"options.{name}"

    knobs = sampling_fields(options, "temperature", "top_p", "top_k")
    # num_ctx is accepted but not applied: the window is the daemon's (--context-length), shared by all clients
    optional(options, "num_ctx", "integer", field("num_ctx"))
    return SamplingParams(
        **knobs,
        seed=optional(options, "seed", "integer", field("seed")),
        max_tokens=_decode_num_predict(optional(options, "num_predict", "integer", field("num_predict"))),
        stop=_decode_stop(options.get("stop")),
    )


def _decode_num_predict(value: int | None) -> int | None:
    if value is None or value in wire.UNLIMITED_PREDICT:
        return None
    if value < 1:
        raise InvalidRequest(f"`options.num_predict` must be at least 1 (or -1 for no limit), got {value}",
                             param="options.num_predict")
    return value


def _decode_stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    items = check_type(raw, "array", "options.stop")
    return tuple(s for i, item in enumerate(items) if (s := check_type(item, "string", f"options.stop[{i}]")))


def _decode_format(raw: object) -> ResponseFormat | None:
    if raw is None or raw == "":
        return None
    if raw == wire.JSON_FORMAT:
        return ResponseFormat(schema=ANY_JSON_OBJECT, name=JSON_OBJECT)
    if isinstance(raw, dict):
        return ResponseFormat(schema=raw)
    raise InvalidRequest(f"`format` must be \"json\" or a JSON schema object, got {raw!r}", param="format")


def _decode_think(raw: object) -> bool | None:
    if raw is None:
        return None
    if isinstance(raw, bool):
        return raw
    if raw in wire.THINK_LEVELS:
        return True
    raise InvalidRequest(f"`think` must be true, false or one of {', '.join(wire.THINK_LEVELS)}; got {raw!r}",
                         param="think")
