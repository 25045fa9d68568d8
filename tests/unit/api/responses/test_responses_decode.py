"""Golden tests: Responses request JSON (and a stored chain) → canonical ChatRequest, and clear 400s."""

from __future__ import annotations

import json

import pytest

from zllm.api.openai_responses.decode import (
    chat_request,
    decode_responses_request,
    plan_turn,
)
from zllm.api.openai_responses.items import encode_reasoning
from zllm.api.openai_responses.tools import CUSTOM_PARAMETERS, CustomFormat, WireTool
from zllm.canonical import (
    ChatRequest,
    FunctionTool,
    Message,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolGrammar,
)
from zllm.errors import InvalidRequest
from zllm.store import StoredResponse

EXEC_PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
LARK = "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\n"


def decode(body: dict, previous: StoredResponse | None = None, namespace: str = ""):
    call = decode_responses_request(body)
    plan = plan_turn(call, previous)
    return call, plan, chat_request(call, plan, request_id="req_1", namespace=namespace)


def test_string_input_minimal():
    call, _, request = decode({"model": "m", "input": "hi"})
    assert request == ChatRequest(id="req_1", model="m", messages=(Message("user", "hi"),),
                                  api="openai_responses")
    assert (call.stream, call.store, call.generate, call.previous_response_id) == (False, True, True, None)


def test_empty_string_input_is_a_warm_up_not_an_error():
    # Codex --oss (lmstudio) sends {"input": "", "max_output_tokens": 1}
    _, _, request = decode({"model": "m", "input": "", "max_output_tokens": 1})
    assert request.messages == (Message("user", ""),)
    assert request.sampling.max_tokens == 1


CODEX_BODY = {
    "model": "gpt-5.5", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1", "client_metadata": {"x": 1}, "parallel_tool_calls": False,
    "tool_choice": "auto", "reasoning": {"effort": "medium"}, "text": {"verbosity": "low"},
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
         "parameters": EXEC_PARAMS},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Agents",
         "tools": [{"type": "function", "name": "spawn_agent", "description": "Spawn", "parameters": EXEC_PARAMS},
                   {"type": "function", "name": "wait_agent"}]},
        {"type": "custom", "name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": LARK}},
        {"type": "tool_search", "execution": "client", "description": "find tools", "parameters": {}},
        {"type": "web_search", "external_web_access": False},
    ],
    "input": [
        {"type": "additional_tools", "id": "at_1", "role": "developer",
         "tools": [{"type": "namespace", "name": "functions", "description": "",
                    "tools": [{"type": "custom", "name": "exec", "format": {"type": "text"}}]}]},
        {"type": "message", "id": "msg_1", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "id": "msg_2", "role": "user",
         "content": [{"type": "input_text", "text": "<environment_context/>"},
                     {"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "summary only"}],
         "content": None, "encrypted_content": encode_reasoning("I should run ls")},
        {"type": "function_call", "id": "fc_1", "status": "completed", "name": "exec_command",
         "arguments": "{\"cmd\": \"ls\"}", "call_id": "call_1"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_1",
         "output": "Chunk ID: 1\nProcess exited with code 0\nOutput:\na.txt"},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_2",
         "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call_output", "id": "ctco_1", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "Script completed"}, {"type": "input_text", "text": "ok"}]},
        {"type": "function_call", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}",
         "call_id": "call_3"},
        {"type": "function_call_output", "call_id": "call_3", "output": "spawned"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ],
}


def test_codex_shaped_body_golden():
    call, plan, request = decode(CODEX_BODY, namespace="ns")
    assert request.messages == (
        Message("system", "You are Codex."),
        Message("user", "<environment_context/>\nlist files"),
        Message("assistant", "", reasoning="I should run ls",
                tool_calls=(ToolCall("call_1", "exec_command", "{\"cmd\": \"ls\"}"),)),
        Message("tool", "Chunk ID: 1\nProcess exited with code 0\nOutput:\na.txt", tool_call_id="call_1",
                name="exec_command"),
        Message("assistant", "", tool_calls=(
            ToolCall("call_2", "apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"})),)),
        Message("tool", "Script completed\nok", tool_call_id="call_2", name="apply_patch"),
        Message("assistant", "", tool_calls=(ToolCall("call_3", "multi_agent_v1.spawn_agent", "{}"),)),
        Message("tool", "spawned", tool_call_id="call_3", name="multi_agent_v1.spawn_agent"),
        Message("assistant", "Done."),
        Message("user", "thanks"),
    )
    assert request.tools == (
        FunctionTool("exec_command", "Run a command", EXEC_PARAMS),
        FunctionTool("multi_agent_v1.spawn_agent", "Spawn", EXEC_PARAMS),
        FunctionTool("multi_agent_v1.wait_agent", ""),
        FunctionTool("apply_patch", "Edit files", CUSTOM_PARAMETERS, grammar=ToolGrammar("lark", LARK)),
        FunctionTool("functions.exec", "", CUSTOM_PARAMETERS),
    )
    assert (request.tool_choice, request.namespace, request.api) == (ToolChoice("auto"), "ns", "openai_responses")
    assert request.cache_hint == "thread-1"  # a hint only: isolation stays the namespace
    assert plan.tools.wire["multi_agent_v1.spawn_agent"] == WireTool("function", "spawn_agent", "multi_agent_v1")
    assert plan.tools.wire["functions.exec"] == WireTool("custom", "exec", "functions")
    assert plan.tools.custom_formats["apply_patch"] == CustomFormat("grammar", "lark", LARK)
    assert (call.stream, call.store, call.encrypted_reasoning) == (True, False, True)
    assert call.echo["prompt_cache_key"] == "thread-1" and call.echo["parallel_tool_calls"] is False
    assert plan.input_tools == tuple(CODEX_BODY["input"][0]["tools"])


def test_reasoning_echo_without_our_encrypted_content_uses_the_summary():
    body = {"model": "m", "input": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}],
         "content": None, "encrypted_content": "gAAAA-openai-ciphertext"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"role": "user", "content": "next"}]}
    _, _, request = decode(body)
    assert request.messages[0] == Message("assistant", "hi", reasoning="a\nb")


def test_instructions_come_first_and_a_chain_continues_the_stored_conversation():
    previous = StoredResponse(
        id="resp_0", namespace="ns", created_at=0.0,
        input_messages=(Message("user", "hi"),), output_messages=(Message("assistant", "hello"),),
        input_tools=({"type": "function", "name": "from_history"},),
    )
    body = {"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_0",
            "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}],
            "tools": [{"type": "function", "name": "now"}]}
    _, plan, request = decode(body, previous)
    assert request.messages == (Message("system", "Be brief."), Message("user", "hi"),
                                Message("assistant", "hello"), Message("tool", "x", tool_call_id="c"))
    assert plan.conversation == request.messages[1:]  # what is stored: never the instructions
    assert [t.name for t in request.tools] == ["now", "from_history"]


def test_sampling_and_tool_choice():
    body = {"model": "m", "input": "x", "temperature": 0, "top_p": 0.5, "max_output_tokens": 7,
            "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}],
            "tool_choice": {"type": "function", "name": "f", "namespace": "ns"}}
    _, _, request = decode(body)
    assert request.sampling == SamplingParams(temperature=0.0, top_p=0.5, max_tokens=7)
    assert request.tool_choice == ToolChoice("tool", "ns.f")


@pytest.mark.parametrize("choice", [{"type": "allowed_tools", "mode": "required", "tools": []}, "required"])
def test_required_tool_choice(choice):
    _, _, request = decode({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}],
                            "tool_choice": choice})
    assert request.tool_choice == ToolChoice("required")


def test_hosted_tool_choice_falls_back_to_auto():
    _, _, request = decode({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}})
    assert request.tool_choice == ToolChoice("auto")


def test_generate_false_and_unknown_fields():
    call = decode_responses_request({"model": "m", "input": [], "generate": False, "some_future_field": 1})
    assert call.generate is False


@pytest.mark.parametrize(("options", "prefill_only"), [
    ({"prewarm": True}, True), ({"prewarm": False}, False), ({"prewarm": None}, False), ({}, False), (None, False),
    ({"prewarm": True, "ttl": "30m", "mode": "implicit"}, True),
])
def test_prompt_cache_options_prewarm_is_a_prefill_only_request(options, prefill_only):
    _, _, request = decode({"model": "m", "input": "hi", "prompt_cache_options": options})
    assert request.prefill_only is prefill_only
    # it overrides `generate: false` (OpenAI's rule): the prompt is prefilled all the same
    assert decode_responses_request({"model": "m", "input": "hi", "generate": False,
                                     "prompt_cache_options": options}).prewarm is prefill_only


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"model": "m", "input": "x", "prompt_cache_options": {"prewarm": "yes"}}, "prompt_cache_options.prewarm",
     "must be a boolean"),
    ({"model": "m", "input": "x", "prompt_cache_options": {"prewarm": 1}}, "prompt_cache_options.prewarm",
     "must be a boolean"),
    ({"model": "m", "input": "x", "prompt_cache_options": True}, "prompt_cache_options", "must be an object"),
    ({"input": "x"}, "model", "missing required parameter"),
    ({"model": "m"}, "input", "must not be empty"),
    ({"model": "m", "input": 3}, "input", "must be an array"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type",
     "unknown text.format type"),
    ({"model": "m", "input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role", "one of"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "text-only"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "missing"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item_reference"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "missing"),
    ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice", "at least one tool"),
    ({"model": "m", "input": "x", "background": True}, "background", "not supported"),
])
def test_bad_requests_name_the_param(body, param, message):
    with pytest.raises(InvalidRequest) as caught:
        decode(body)
    assert caught.value.param == param
    assert message in caught.value.message


def test_tool_output_media_becomes_a_placeholder_not_an_error():
    body = {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "see:"}, {"type": "input_image", "image_url": "data:..."}]}]}
    _, _, request = decode(body)
    assert request.messages[0].content == "see:\n[image omitted: this model reads text only]"
