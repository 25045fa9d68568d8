"""The conversation of tests/unit/test_three_apis_render_alike.py sent the Ollama way renders to the same prompt
token ids as through Chat Completions: what lets /api/chat and /v1/chat/completions share prefix-cache entries."""

from __future__ import annotations

import json

from tests.support.tiny_models import tiny_qwen_tokenizer
from tests.unit.test_three_apis_render_alike import ARGS, ASK, CHAT, FOLLOW_UP, LISTING, SCHEMA, SYSTEM
from zllm.api.ollama.decode import decode_chat
from zllm.api.openai_chat.decode import decode_chat_request
from zllm.prompt import PromptRenderer

OLLAMA = {
    "model": "m",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ASK},
        # no call id (the ollama package has none), arguments as an object
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": ARGS}}]},
        {"role": "tool", "tool_name": "ls", "content": LISTING},
        {"role": "user", "content": FOLLOW_UP},
    ],
    # in the key order the ollama package sends (Ollama's Go struct order): `required` before `properties`
    "tools": [{"type": "function", "function": {"name": "ls", "description": "List files.", "parameters": {
        "type": SCHEMA["type"], "required": SCHEMA["required"], "properties": SCHEMA["properties"]}}}],
}


def test_ollama_renders_the_same_prompt_token_ids_as_chat_completions() -> None:
    renderer = PromptRenderer(tiny_qwen_tokenizer())
    ollama = decode_chat(OLLAMA, request_id="r", namespace="").request
    chat = decode_chat_request(CHAT, request_id="r", namespace="").request
    assert [(m.role, m.content, [(c.name, json.loads(c.arguments)) for c in m.tool_calls]) for m in ollama.messages] \
        == [(m.role, m.content, [(c.name, json.loads(c.arguments)) for c in m.tool_calls]) for m in chat.messages]
    assert json.dumps(ollama.tools[0].parameters) == json.dumps(chat.tools[0].parameters)  # key order included
    assert renderer.render(ollama).token_ids == renderer.render(chat).token_ids
