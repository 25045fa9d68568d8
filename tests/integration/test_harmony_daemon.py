"""gpt-oss's harmony end to end through a real daemon: a tiny random model over the o200k_harmony stand-in
(tests/support/harmony_models.py), served by `zllm serve`, driven by the official openai SDK (Responses) and
Ollama's `/api/chat` with tools.

- the registry picks harmony from the vocabulary alone (the model is a Qwen3 architecture: no name says gpt-oss);
- Responses with tool_choice required: the fence makes the random model write a valid call, which comes back as
  a function_call item; the next turn (previous_response_id + function_call_output) starts with the first turn's
  prompt + output: the prefix cache holds all of it but the last sampled token (`<|call|>`);
- the same conversation through /api/chat with tools (Ollama's `think: "low"` is the same effort as Responses'
  "none" maps to) renders the same prompt, token for token, so it hits the cache the Responses turns left.
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.support.daemon import Daemon
from tests.support.harmony_models import harmony_tokenizer_or_skip, tiny_harmony_dir
from zllm.models import ModelStore

MODEL = "tiny-harmony"
KEY = "test-key"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
              "required": ["city"], "additionalProperties": False}
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
                    "parameters": PARAMETERS}]
OLLAMA_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                  "parameters": PARAMETERS}}]
INSTRUCTIONS = "You check the weather."
# the daemon's start builds llguidance's view of a 201k vocabulary (~20 s alone, minutes on a busy machine)
pytestmark = pytest.mark.timeout(900)
QUESTION = "Weather in Paris?"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    harmony_tokenizer_or_skip()
    data_dir = tmp_path_factory.mktemp("harmony-data")
    ModelStore(data_dir / "models").pull(str(tiny_harmony_dir()), name=MODEL)
    proc = Daemon(data_dir, MODEL, "--context-length", "1024").wait_ready(timeout=300)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def first_turns(daemon: Daemon):
    """A forced call, then its result: the two Responses turns (the Ollama test continues from them)."""
    sdk = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    call_turn = sdk.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, tools=RESPONSES_TOOLS,
                                     tool_choice="required", reasoning={"effort": "none"}, temperature=0,
                                     max_output_tokens=64)
    calls = [item for item in call_turn.output if item.type == "function_call"]
    result_turn = sdk.responses.create(
        model=MODEL, previous_response_id=call_turn.id, instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS,
        tool_choice="none",
        reasoning={"effort": "none"}, temperature=0, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}] if calls else "x")
    return call_turn, calls, result_turn


def test_the_vocabulary_chooses_harmony(daemon: Daemon) -> None:
    assert "tool dialect harmony" in daemon.log()


def test_a_responses_call_then_its_result_continue_one_prompt(first_turns) -> None:
    call_turn, calls, result_turn = first_turns
    assert [c.name for c in calls] == ["get_weather"], call_turn.output
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str) and len(arguments["city"]) <= 10
    assert call_turn.status == "completed"
    cached = result_turn.usage.input_tokens_details.cached_tokens
    assert cached == call_turn.usage.input_tokens + call_turn.usage.output_tokens - 1, (
        "the result turn's prompt must start with the call turn's prompt + output")


def test_ollama_chat_with_tools_renders_the_same_conversation(daemon: Daemon, first_turns) -> None:
    """Raw /api/chat (the ollama client drops the `zllm` extension field that reports cached tokens)."""
    call_turn, calls, result_turn = first_turns
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": json.loads(calls[0].arguments)}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
    ]
    body = {"model": MODEL, "messages": messages, "tools": OLLAMA_TOOLS, "think": "low", "stream": False,
            "options": {"temperature": 0, "num_predict": 4}}
    request = urllib.request.Request(f"{daemon.base_url}/api/chat", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert answer["done"] and answer["message"]["role"] == "assistant"
    # the Responses turn's very prompt: every token of it but the last was already cached
    assert answer["prompt_eval_count"] == result_turn.usage.input_tokens
    assert answer["zllm"]["cached_tokens"] >= answer["prompt_eval_count"] - 1, answer
