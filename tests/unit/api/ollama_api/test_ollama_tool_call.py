"""A tool call through the whole stack: the ollama client → /api/chat → the real runtime over the tiny Qwen model
(hermes dialect) → the dialect's parser → Ollama's `message.tool_calls`. The model's output is scripted: a
random-weight model never writes a call by itself, and Ollama's API has no tool_choice to force one."""

from __future__ import annotations

import ollama
import pytest
import torch

from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import scripted_output, tiny_qwen_dir
from zllm.api import create_app
from zllm.engine.torch.loader import load_model
from zllm.runtime.client import LocalEngineClient

torch.set_num_threads(1)

MODEL = "tiny"
IM_END = 151645
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def loaded():
    return load_model(tiny_qwen_dir(), device="cpu", threads=1)


@pytest.fixture
def client(loaded):
    engine = LocalEngineClient(loaded, MODEL, created=1_700_000_000)
    server = ThreadedServer(create_app(engine)).start()
    yield ollama.Client(host=server.url, timeout=60)
    server.stop()
    engine.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_hermes_call_arrives_as_message_tool_calls(loaded, client, stream):
    script = [*loaded.tokenizer.encode(CALL_TEXT, add_special_tokens=False), IM_END]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with scripted_output(loaded.model, script):
        answer = client.chat(model=MODEL, messages=messages, tools=[WEATHER], options={"temperature": 0},
                             stream=stream)
        chunks = list(answer) if stream else [answer]
    calls = [call for chunk in chunks for call in (chunk.message.tool_calls or [])]
    assert [(call.function.name, dict(call.function.arguments)) for call in calls] == [("get_weather",
                                                                                       {"city": "paris"})]
    assert chunks[-1].done and chunks[-1].done_reason == "stop"
    assert "<tool_call>" not in "".join(chunk.message.content or "" for chunk in chunks)
