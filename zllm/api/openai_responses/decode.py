"""OpenAI Responses request JSON → `ResponsesCall`, then (with the chain it continues) → canonical `ChatRequest`.

    {"model": "m", "stream": true, "store": false, "include": ["reasoning.encrypted_content"],
     "instructions": "Be brief.", "previous_response_id": "resp_…",
     "input": "hi" | [items…],                      (see items.py)
     "tools": [{"type": "function", …}, {"type": "namespace", …}, {"type": "custom", …}],
     "tool_choice": "auto", "parallel_tool_calls": true, "max_output_tokens": 256,
     "temperature": 0.2, "top_p": 1, "reasoning": {"effort": "medium"}, "text": {"format": {"type": "text"}},
     "metadata": {…}, "user": "…", "prompt_cache_key": "<thread id>", "generate": false,
     "prompt_cache_options": {"prewarm": true}}

`prompt_cache_options.prewarm: true` prefills the prompt into the prefix cache and generates nothing (canonical
`prefill_only`; it overrides `generate`, as OpenAI documents): the response completes with no output and
usage saying what was read from the cache and written to it. `generate: false` alone runs nothing.

A chained turn's conversation is the stored one (input + output of `previous_response_id`) plus the new
input; `instructions` never carry over (OpenAI's rule), so they are put in front of each request afresh.

`prompt_cache_key` (Codex: the thread id) becomes the canonical `cache_hint`: only a hint for which cached
prefix to try first, never isolation (that is the API key's namespace). Not mapped to canonical (there is
no canonical field yet), only echoed back: `parallel_tool_calls`, `reasoning`, `text.verbosity`,
`truncation`, `user`, `metadata`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zllm.api.fields import check_type, decode_model, optional, sampling_fields
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.compaction_seal import CompactionSeal
from zllm.api.openai_responses.items import (
    DecodedInput,
    decode_input,
    name_tool_results,
)
from zllm.api.openai_responses.tools import ToolSet, decode_tool_choice, decode_tools
from zllm.api.output_options import decode_format, thinking_from_effort
from zllm.canonical import ChatRequest, Message, ResponseFormat, SamplingParams
from zllm.errors import InvalidRequest
from zllm.store import StoredResponse

API_NAME = "openai_responses"

# request fields copied as sent into the Response object (clients read some of them back)
ECHOED_FIELDS = ("metadata", "user", "prompt_cache_key", "reasoning", "truncation", "service_tier")


@dataclass(frozen=True)
class ResponsesCall:
    """A decoded `POST /v1/responses` body (or WebSocket `response.create` frame), before its chain is known."""

    model: str
    input: DecodedInput
    instructions: str | None = None
    tools_json: tuple[tuple[dict, str], ...] = ()   # (tool, param) from `tools`
    tool_choice_json: object = None
    sampling: SamplingParams = SamplingParams()
    stream: bool = False
    store: bool = True
    encrypted_reasoning: bool = False
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    generate: bool = True
    prewarm: bool = False                             # prompt_cache_options.prewarm
    thinking: bool | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    echo: dict = field(default_factory=dict)          # fields the Response object repeats


@dataclass(frozen=True)
class Plan:
    """What one turn sends to the engine, and what its stored record needs."""

    conversation: tuple[Message, ...]        # history + new input, without the instructions
    input_tools: tuple[dict, ...]            # tools declared by input items, this turn's and the chain's
    tools: ToolSet


def decode_responses_request(body: dict, *, seal: CompactionSeal | None = None) -> ResponsesCall:
    """`seal` opens the `compaction` items of `input` (compaction_seal.py)."""
    _reject_unsupported(body)
    include = optional(body, "include", "array") or []
    instructions = optional(body, "instructions", "string")
    raw_tools = optional(body, "tools", "array") or []
    return ResponsesCall(
        model=decode_model(body),
        input=decode_input(body.get("input"), seal=seal),
        instructions=instructions or None,
        tools_json=tuple((tool, f"tools[{i}]") for i, tool in enumerate(raw_tools)),
        tool_choice_json=body.get("tool_choice"),
        sampling=_decode_sampling(body),
        stream=bool(optional(body, "stream", "boolean")),
        store=optional(body, "store", "boolean") is not False,
        encrypted_reasoning=wire.INCLUDE_ENCRYPTED_REASONING in include,
        previous_response_id=optional(body, "previous_response_id", "string") or None,
        prompt_cache_key=optional(body, "prompt_cache_key", "string") or None,
        generate=optional(body, "generate", "boolean") is not False,
        prewarm=_prewarm(body),
        thinking=thinking_from_effort(_effort(body), "reasoning.effort"),
        reasoning_effort=_effort(body),  # checked by thinking_from_effort
        response_format=decode_format(_text_format(body), "text.format", nested_schema=False),
        echo=_echo(body, raw_tools, instructions),
    )


def _effort(body: dict) -> object:
    return (optional(body, "reasoning", "object") or {}).get("effort")


def plan_turn(call: ResponsesCall, previous: StoredResponse | None) -> Plan:
    history = previous.conversation if previous else ()
    history_tools = previous.input_tools if previous else ()
    declared = [
        *call.tools_json,
        *((tool, f"previous_response.tools[{j}]") for j, tool in enumerate(history_tools)),
        *call.input.tools,
    ]
    return Plan(
        conversation=name_tool_results(history + call.input.messages),
        input_tools=history_tools + tuple(tool for tool, _ in call.input.tools),
        tools=decode_tools(declared),
    )


def chat_request(call: ResponsesCall, plan: Plan, *, request_id: str, namespace: str) -> ChatRequest:
    instructions = (Message("system", call.instructions),) if call.instructions else ()
    messages = instructions + plan.conversation
    if not messages:
        raise InvalidRequest("`input` must not be empty (and there is no previous response to continue)",
                             param="input")
    return ChatRequest(
        id=request_id,
        model=call.model,
        messages=messages,
        sampling=call.sampling,
        tools=plan.tools.tools,
        tool_choice=decode_tool_choice(call.tool_choice_json, plan.tools),
        namespace=namespace,
        api=API_NAME,
        cache_hint=call.prompt_cache_key,
        thinking=call.thinking,
        reasoning_effort=call.reasoning_effort,
        response_format=call.response_format,
        prefill_only=call.prewarm,
    )


def _prewarm(body: dict) -> bool:
    options = optional(body, "prompt_cache_options", "object") or {}
    return bool(optional(options, "prewarm", "boolean", "prompt_cache_options.prewarm"))


def _text_format(body: dict) -> dict | None:
    text = optional(body, "text", "object") or {}
    return optional(text, "format", "object", "text.format")


def _reject_unsupported(body: dict) -> None:
    """Fail loudly on options we would otherwise silently not honour."""
    if optional(body, "background", "boolean"):
        raise InvalidRequest("background responses are not supported", param="background")
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise InvalidRequest(f"`{name}` is not supported: send the input items themselves", param=name)


def _decode_sampling(body: dict) -> SamplingParams:
    max_tokens = optional(body, "max_output_tokens", "integer")
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(f"`max_output_tokens` must be at least 1, got {max_tokens}", param="max_output_tokens")
    return SamplingParams(**sampling_fields(body, "temperature", "top_p"), max_tokens=max_tokens)


def _echo(body: dict, raw_tools: list, instructions: str | None) -> dict:
    echo = {name: body[name] for name in ECHOED_FIELDS if body.get(name) is not None}
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {
        **echo,
        "instructions": instructions,
        "tools": raw_tools,
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store") is not False,
        "text": {"format": {"type": wire.TEXT_FORMAT}, **text},
        "metadata": check_type(body.get("metadata") or {}, "object", "metadata"),
    }
