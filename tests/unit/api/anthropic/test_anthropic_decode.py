"""Golden tests: Anthropic Messages request JSON → canonical `ChatRequest`."""

from __future__ import annotations

import json

import pytest

from zllm.api.anthropic_messages.decode import (
    decode_count_tokens_request,
    decode_messages_request,
)
from zllm.api.anthropic_messages.signature import sign_thinking
from zllm.api.openai_chat.decode import decode_chat_request
from zllm.canonical import (
    ChatRequest,
    FunctionTool,
    Message,
    SamplingParams,
    ToolCall,
    ToolChoice,
)
from zllm.errors import InvalidRequest

MODEL = "fake-model"
BASH_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
    "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
    "required": ["command"], "additionalProperties": False,
}
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}
THOUGHT = "I should list the files."
REMINDER = "<system-reminder>\nAttribution for git commits: none.\n</system-reminder>\n"

# The shape of Claude Code 2.1.332's second agent request (design/CLIENTS.md §3.4–3.5), shortened.
CLAUDE_CODE_BODY = {
    "model": MODEL,
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nYou are an agent working with the user.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "list files"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nToday's date is 2026-01-01.",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": sign_thinking(MODEL, THOUGHT)},
            {"type": "text", "text": "Let me use a tool."},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash",
             "input": {"command": "ls -la", "description": "List files"}}]},
        {"role": "user", "content": [{"tool_use_id": "toolu_01", "type": "tool_result", "content": "total 12\nout.txt",
                                      "is_error": False, "cache_control": {"type": "ephemeral"}}]},
    ],
    "tools": [
        {"name": "Bash", "description": "Run a shell command.", "input_schema": BASH_SCHEMA},
        {"name": "Read", "description": "Read a file.", "input_schema": READ_SCHEMA,
         "cache_control": {"type": "ephemeral"}},
        {"name": "DeferredToolPlaceholder", "description": "Deferred.", "input_schema": {}, "defer_loading": True},
    ],
    "metadata": {"user_id": json.dumps({"device_id": "ab" * 32, "account_uuid": "", "session_id": "s-1"})},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "safeguards": [{"type": "dangerous_tool_use", "classifier_context": {"cwd": "/tmp"}}],
}

EXPECTED_MESSAGES = (
    # the billing header stays in the canonical form: the renderer drops (and reports) it on every API path
    Message("system", "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;\n"
                      "You are a Claude agent.\n\nYou are an agent working with the user."),
    Message("user", REMINDER + "\nlist files"),
    Message("system", "# Environment\nToday's date is 2026-01-01."),
    Message("assistant", "Let me use a tool.", reasoning=THOUGHT,
            tool_calls=(ToolCall("toolu_01", "Bash", '{"command":"ls -la","description":"List files"}'),)),
    Message("tool", "total 12\nout.txt", tool_call_id="toolu_01", name="Bash"),
)


def decode(body: dict) -> ChatRequest:
    return decode_messages_request(body, request_id="req_1", namespace="ns").request


def body_with(messages: list, **fields) -> dict:
    return {"model": MODEL, "max_tokens": 16, "messages": messages, **fields}


def test_claude_code_request_golden():
    call = decode_messages_request(CLAUDE_CODE_BODY, request_id="req_1", namespace="ns")
    assert call.stream is True
    assert call.request == ChatRequest(
        id="req_1",
        model=MODEL,
        messages=EXPECTED_MESSAGES,
        sampling=SamplingParams(max_tokens=32000),
        tools=(FunctionTool("Bash", "Run a shell command.", BASH_SCHEMA),
               FunctionTool("Read", "Read a file.", READ_SCHEMA)),  # the deferred tool is not loaded
        tool_choice=ToolChoice("auto"),
        namespace="ns",
        api="anthropic_messages",
        thinking=True,  # Claude Code's "adaptive"
    )


def test_same_conversation_through_openai_chat_gives_the_same_messages():
    chat_body = {"model": MODEL, "messages": [
        # a proxy forwards the system blocks as content parts, billing header included
        {"role": "system", "content": [{"type": "text", "text": block["text"]} for block in CLAUDE_CODE_BODY["system"]]},
        {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "list files"}]},
        {"role": "developer", "content": "# Environment\nToday's date is 2026-01-01."},
        {"role": "assistant", "content": "Let me use a tool.", "reasoning_content": THOUGHT, "tool_calls": [
            {"id": "toolu_01", "type": "function",
             "function": {"name": "Bash", "arguments": {"command": "ls -la", "description": "List files"}}}]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "total 12\nout.txt"},
    ]}
    chat = decode_chat_request(chat_body, request_id="req_1", namespace="ns").request
    assert chat.messages == decode(CLAUDE_CODE_BODY).messages


def test_count_tokens_decodes_the_same_prompt_without_max_tokens():
    body = {key: value for key, value in CLAUDE_CODE_BODY.items() if key not in ("max_tokens", "stream")}
    request = decode_count_tokens_request(body, request_id="req_1", namespace="ns")
    generation = decode(CLAUDE_CODE_BODY)
    assert (request.messages, request.tools) == (generation.messages, generation.tools)
    assert request.sampling.max_tokens is None


def test_max_tokens_0_is_a_prefill_only_request_of_the_same_prompt():
    warm = decode(body_with(USER, max_tokens=0))
    assert warm.prefill_only and warm.sampling.max_tokens is None
    assert not decode(body_with(USER)).prefill_only
    assert warm.messages == decode(body_with(USER)).messages


def test_system_as_string_and_absent():
    assert decode(body_with([{"role": "user", "content": "hi"}], system="Be brief.")).messages == (
        Message("system", "Be brief."), Message("user", "hi"))
    assert decode(body_with([{"role": "user", "content": "hi"}])).messages == (Message("user", "hi"),)


def test_foreign_unsigned_and_redacted_thinking_are_dropped():
    assistant = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "claude's own thoughts", "signature": "EqQBCkYIBxgCKkBxyz"},
        {"type": "thinking", "thinking": "unsigned", "signature": ""},
        {"type": "thinking", "thinking": THOUGHT, "signature": sign_thinking("other-model", THOUGHT)},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
        {"type": "text", "text": "Hi."}]}
    messages = decode(body_with([{"role": "user", "content": "hi"}, assistant])).messages
    assert messages[1] == Message("assistant", "Hi.", reasoning=None)


def test_own_thinking_blocks_are_concatenated_like_the_stream_that_produced_them():
    first, second = "Look first.", " Then answer."
    assistant = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": first, "signature": sign_thinking(MODEL, first)},
        {"type": "text", "text": "Part one."},
        {"type": "thinking", "thinking": second, "signature": sign_thinking(MODEL, second)},
        {"type": "text", "text": " Part two."}]}
    message = decode(body_with([{"role": "user", "content": "hi"}, assistant])).messages[1]
    assert (message.content, message.reasoning) == ("Part one. Part two.", "Look first. Then answer.")


def test_user_blocks_split_into_tool_results_and_text_in_order():
    calls = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {"file_path": "/ä"}},
        {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {}}]}
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "1\tx"},
                                                                      {"type": "text", "text": "2\ty"}]},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "command not found", "is_error": True},
        {"type": "tool_result", "tool_use_id": "toolu_b", "is_error": True},
        {"type": "text", "text": "continue"}]}
    messages = decode(body_with([{"role": "user", "content": "go"}, calls, results])).messages
    assert messages[1].tool_calls == (ToolCall("toolu_a", "Read", '{"file_path":"/ä"}'),
                                      ToolCall("toolu_b", "Bash", "{}"))
    assert messages[2:] == (
        Message("tool", "1\tx\n2\ty", tool_call_id="toolu_a", name="Read"),
        Message("tool", "Error: command not found", tool_call_id="toolu_b", name="Bash"),
        Message("tool", "Error", tool_call_id="toolu_b", name="Bash"),
        Message("user", "continue"),
    )


def test_consecutive_same_role_messages_are_kept_as_sent():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": []}, {"role": "user", "content": "b"}]
    assert decode(body_with(messages)).messages == (Message("user", "a"), Message("user", ""), Message("user", "b"))


def test_tool_reference_loads_a_deferred_tool():
    tools = [{"name": "ToolSearch", "input_schema": {"type": "object"}},
             {"name": "WebFetch", "input_schema": {"type": "object"}, "defer_loading": True},
             {"name": "CronCreate", "input_schema": {"type": "object"}, "defer_loading": True}]
    messages = [
        {"role": "user", "content": "fetch it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]}]}]
    request = decode(body_with(messages, tools=tools))
    assert [tool.name for tool in request.tools] == ["ToolSearch", "WebFetch"]
    assert request.messages[-1].content == "Tool loaded: WebFetch"
    forced = decode(body_with(messages[:1], tools=tools, tool_choice={"type": "tool", "name": "CronCreate"}))
    assert [tool.name for tool in forced.tools] == ["ToolSearch", "CronCreate"]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [({"type": "auto"}, ToolChoice("auto")), ({"type": "any"}, ToolChoice("required")),
     ({"type": "none"}, ToolChoice("none")), ({"type": "tool", "name": "Read"}, ToolChoice("tool", "Read")),
     ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice("auto"))],
)
def test_tool_choice(choice, expected):
    tools = [{"name": "Read", "input_schema": READ_SCHEMA}]
    request = decode(body_with([{"role": "user", "content": "x"}], tools=tools, tool_choice=choice))
    assert request.tool_choice == expected


def test_sampling_fields():
    body = body_with([{"role": "user", "content": "x"}], temperature=0.2, top_p=0.9, top_k=40,
                     stop_sequences=["\n\nHuman:", "END"])
    assert decode(body).sampling == SamplingParams(temperature=0.2, top_p=0.9, top_k=40, max_tokens=16,
                                                   stop=("\n\nHuman:", "END"))


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": MODEL, "messages": USER}, "max_tokens", "missing required parameter `max_tokens`"),
        (body_with(USER, max_tokens=-1), "max_tokens", "at least 0"),
        ({"model": MODEL, "max_tokens": 5}, "messages", "missing required parameter `messages`"),
        (body_with([]), "messages", "must not be empty"),
        ({"max_tokens": 5, "messages": USER}, "model", "missing required parameter `model`"),
        (body_with([{"role": "tool", "content": "x"}]), "messages[0].role", "user, assistant or system"),
        (body_with([{"role": "user"}]), "messages[0].content", "missing required parameter"),
        (body_with([{"role": "user", "content": [{"type": "image", "source": {}}]}]), "messages[0].content[0].type",
         "image content ('image' blocks) is not supported"),
        (body_with([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "document", "source": {}}]}]}]), "messages[0].content[0].content[0].type", "not supported"),
        (body_with(USER, system=[{"type": "image", "source": {}}]), "system[0].type", "not supported"),
        (body_with([{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]),
         "messages[0].content[0].type", "not allowed in user content"),
        (body_with(USER, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type",
         "Anthropic-defined tool"),
        (body_with(USER, tool_choice={"type": "any"}), "tool_choice", "at least one tool"),
        (body_with(USER, tool_choice={"type": "sometimes"}), "tool_choice.type", "auto, any, tool or none"),
        (body_with(USER, stop_sequences=[""]), "stop_sequences", "non-empty"),
        (body_with(USER, thinking="on"), "thinking", "must be an object"),
    ],
)
def test_invalid_requests_name_the_field(body, param, words):
    with pytest.raises(InvalidRequest) as caught:
        decode(body)
    assert caught.value.param == param
    assert words in caught.value.message
