"""Golden tests: OpenAI Chat Completions request JSON → canonical ChatRequest (and clear 400s)."""

from __future__ import annotations

import pytest

from zllm.api.json_body import parse_json_object
from zllm.api.openai_chat.decode import decode_chat_request
from zllm.canonical import (
    ChatRequest,
    FunctionTool,
    Message,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
)
from zllm.errors import InvalidRequest


def decode(body: dict, namespace: str = ""):
    return decode_chat_request(body, request_id="req_1", namespace=namespace)


def minimal(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_minimal_request():
    call = decode(minimal(), namespace="ns1")
    assert call.request == ChatRequest(
        id="req_1", model="m", messages=(Message("user", "hi"),), namespace="ns1", api="openai_chat"
    )
    assert (call.stream, call.include_usage) == (False, False)


def test_agent_turn_with_tools_golden():
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "list"}, {"type": "text", "text": "files"}]},
            {"role": "assistant", "content": None, "reasoning_content": "use sh",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "sh", "arguments": "{\"cmd\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "sh", "description": "run", "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "sh"}},
        "max_completion_tokens": 256, "max_tokens": 9, "temperature": 0, "top_p": 0.9, "top_k": 20,
        "seed": 7, "stop": ["\n\n", "END"], "n": 1, "user": "u", "response_format": {"type": "text"},
        "parallel_tool_calls": True, "some_vendor_extension": {"x": 1},
    }
    call = decode(body)
    assert call.request == ChatRequest(
        id="req_1",
        model="m",
        messages=(
            Message("system", "Be brief."),
            Message("user", "list\nfiles"),
            Message("assistant", "", tool_calls=(ToolCall("call_1", "sh", '{"cmd":"ls"}'),), reasoning="use sh"),
            Message("tool", "a.txt", tool_call_id="call_1", name="sh"),
        ),
        sampling=SamplingParams(temperature=0.0, top_p=0.9, top_k=20, seed=7, max_tokens=256, stop=("\n\n", "END")),
        tools=(FunctionTool("sh", "run", {"type": "object", "properties": {"cmd": {"type": "string"}}}),),
        tool_choice=ToolChoice("tool", "sh"),
        api="openai_chat",
    )
    assert (call.stream, call.include_usage) == (True, True)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 100}, SamplingParams(max_tokens=100)),
        ({"stop": "END"}, SamplingParams(stop=("END",))),
        ({"stop": None, "temperature": None}, SamplingParams()),
        ({"top_k": -1}, SamplingParams(top_k=0)),
        ({"max_tokens": 64.0}, SamplingParams(max_tokens=64)),
        ({"stop": ["a", "b", "c", "d", "e", "f"]}, SamplingParams(stop=("a", "b", "c", "d", "e", "f"))),
    ],
)
def test_sampling_fields(fields, expected):
    assert decode(minimal(**fields)).request.sampling == expected


@pytest.mark.parametrize("choice", ["none", "auto", "required"])
def test_tool_choice_modes(choice):
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = decode(minimal(tools=tools, tool_choice=choice)).request
    assert request.tool_choice == ToolChoice(choice)
    assert request.tools == (FunctionTool("f"),)


def test_include_usage_only_counts_when_streaming():
    assert decode(minimal(stream_options={"include_usage": True})).include_usage is False


def test_prompt_cache_key_becomes_the_cache_hint():
    assert decode(minimal(prompt_cache_key="session-7")).request.cache_hint == "session-7"
    assert decode(minimal(prompt_cache_key="")).request.cache_hint is None
    assert decode(minimal()).request.cache_hint is None
    with pytest.raises(InvalidRequest) as raised:
        decode(minimal(prompt_cache_key=7))
    assert raised.value.param == "prompt_cache_key"


def test_assistant_tool_call_arguments_as_object_and_missing_id():
    body = minimal(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
    ])
    assistant = decode(body).request.messages[1]
    assert assistant.tool_calls == (ToolCall("call_0", "f", '{"a":1}'),)
    assert assistant.content == ""


@pytest.mark.parametrize(
    ("body", "param", "message_part"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing required parameter `model`"),
        ({"model": "m"}, "messages", "missing required parameter `messages`"),
        (minimal(messages=[]), "messages", "must not be empty"),
        (minimal(messages="hi"), "messages", "must be an array"),
        (minimal(messages=[{"role": "function", "content": "x"}]), "messages[0].role", "must be one of"),
        (minimal(messages=[{"content": "x"}]), "messages[0].role", "missing required"),
        (minimal(messages=[{"role": "user"}]), "messages[0].content", "missing required"),
        (minimal(messages=[{"role": "user", "content": 5}]), "messages[0].content", "string or an array"),
        (minimal(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content[0].type", "not supported"),
        (minimal(messages=[{"role": "user", "content": [{"type": "video"}]}]),
         "messages[0].content[0].type", "unknown content part type"),
        (minimal(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id", "missing required"),
        (minimal(n=2), "n", "`n` must be 1"),
        (minimal(response_format={"type": "json_schema"}), "response_format.json_schema", "missing required"),
        (minimal(response_format={"type": "yaml"}), "response_format.type", "unknown response_format type"),
        (minimal(reasoning_effort="extreme"), "reasoning_effort", "must be one of"),
        (minimal(tools=[{"type": "web_search"}]), "tools[0].type", "only function tools"),
        (minimal(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "missing required"),
        (minimal(tool_choice="required"), "tool_choice", "needs at least one tool"),
        (minimal(tool_choice="sometimes"), "tool_choice", "must be none, auto, required"),
        (minimal(tools=[{"type": "function", "function": {"name": "f"}}],
                 tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice", "unknown tool"),
        (minimal(max_tokens=0), "max_tokens", "at least 1"),
        (minimal(max_completion_tokens=-5), "max_completion_tokens", "at least 1"),
        (minimal(max_tokens="many"), "max_tokens", "must be an integer, got string"),
        (minimal(temperature="hot"), "temperature", "must be a number"),
        (minimal(temperature=True), "temperature", "must be a number, got boolean"),
        (minimal(top_p=0), "top_p", "top_p"),
        (minimal(stop=["a", 3]), "stop[1]", "must be a string"),
        (minimal(stop=[""]), "stop", "non-empty"),
        (minimal(stream="yes"), "stream", "must be a boolean"),
        (minimal(logprobs=True), "logprobs", "not supported"),
        (minimal(functions=[{"name": "f"}]), "functions", "send `tools`"),
    ],
)
def test_invalid_requests_name_the_field(body, param, message_part):
    with pytest.raises(InvalidRequest) as caught:
        decode(body)
    assert caught.value.param == param
    assert message_part in caught.value.message


@pytest.mark.parametrize(
    ("raw", "message_part"),
    [(b"", "empty"), (b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"), (b"\xff\xfe", "JSON")],
)
def test_body_must_be_a_json_object(raw, message_part):
    with pytest.raises(InvalidRequest, match=message_part):
        parse_json_object(raw)


def test_output_options_become_canonical():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = decode(minimal(
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
        reasoning_effort="none")).request
    assert request.response_format == ResponseFormat(schema=schema, name="thing")
    assert request.thinking is False
    request = decode(minimal(response_format={"type": "json_object"}, reasoning_effort="high")).request
    assert request.response_format.schema == {"type": "object"} and request.thinking is True
    plain = decode(minimal(response_format={"type": "text"})).request
    assert plain.response_format is None and plain.thinking is None


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1), ("max_tokens", 10**40), ("top_k", 2**63),
    ("seed", 1e300),  # an integral float is an integer, and this one has 301 digits
])
def test_integers_beyond_64_bits_are_refused_by_name(field: str, value) -> None:
    with pytest.raises(InvalidRequest, match="integers must fit in 64 bits") as caught:
        decode(minimal(**{field: value}))
    assert caught.value.param == field


def test_the_64_bit_edges_are_accepted() -> None:
    assert decode(minimal(seed=2**63 - 1)).request.sampling.seed == 2**63 - 1
    assert decode(minimal(seed=-(2**63))).request.sampling.seed == -(2**63)
