"""One conversation sent through Chat Completions, Responses and Anthropic Messages becomes the same canonical
messages and the same prompt token ids — the property the prefix cache relies on when clients mix APIs."""

from __future__ import annotations

import json

import pytest

from tests.support.tiny_models import tiny_qwen_tokenizer
from zllm.api.anthropic_messages.decode import decode_messages_request
from zllm.api.openai_chat.decode import decode_chat_request
from zllm.api.openai_responses.decode import chat_request, decode_responses_request, plan_turn
from zllm.prompt import PromptRenderer

SYSTEM = "You are terse. Answer in one line."
ASK = "What files are here?"
LISTING = "a.txt\nb.txt"
FOLLOW_UP = "Thanks. Which one is bigger?"
ARGS = {"path": ".", "all": True}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "all": {"type": "boolean"}},
          "required": ["path"]}

CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": json.dumps(ARGS)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": LISTING},
        {"role": "user", "content": FOLLOW_UP},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "description": "List files.", "parameters": SCHEMA}}],
}

RESPONSES = {
    "model": "m",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
        {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": json.dumps(ARGS)},
        {"type": "function_call_output", "call_id": "call_1", "output": LISTING},
        {"type": "message", "role": "user", "content": FOLLOW_UP},
    ],
    "tools": [{"type": "function", "name": "ls", "description": "List files.", "parameters": SCHEMA}],
}

ANTHROPIC = {
    "model": "m",
    "max_tokens": 64,
    "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "ls", "input": ARGS}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": LISTING},
            {"type": "text", "text": FOLLOW_UP},
        ]},
    ],
    "tools": [{"name": "ls", "description": "List files.", "input_schema": SCHEMA}],
}


def canonical_requests():
    chat = decode_chat_request(CHAT, request_id="r", namespace="").request
    call = decode_responses_request(RESPONSES)
    responses = chat_request(call, plan_turn(call, None), request_id="r", namespace="")
    anthropic = decode_messages_request(ANTHROPIC, request_id="r", namespace="").request
    return {"chat": chat, "responses": responses, "anthropic": anthropic}


@pytest.fixture(scope="module")
def renderer() -> PromptRenderer:
    return PromptRenderer(tiny_qwen_tokenizer())


def with_parsed_arguments(messages):
    # arguments stay the JSON text each client sent (Anthropic sends an object, re-serialized compactly);
    # the renderer reads them as JSON, so compare them as values
    return [
        (m.role, m.content, m.tool_call_id, m.name,
         [(c.id, c.name, json.loads(c.arguments)) for c in m.tool_calls])
        for m in messages
    ]


def test_the_three_apis_give_the_same_canonical_conversation() -> None:
    requests = canonical_requests()
    chat = requests["chat"]
    for api in ("responses", "anthropic"):
        assert with_parsed_arguments(requests[api].messages) == with_parsed_arguments(chat.messages), api
        assert requests[api].tools == chat.tools, api


def test_the_three_apis_give_the_same_prompt_token_ids(renderer: PromptRenderer) -> None:
    rendered = {api: renderer.render(request).token_ids for api, request in canonical_requests().items()}
    assert rendered["responses"] == rendered["chat"]
    assert rendered["anthropic"] == rendered["chat"]
    text = renderer.tokenizer.decode(rendered["chat"])
    assert SYSTEM in text and LISTING in text and FOLLOW_UP in text and '"name": "ls"' in text
