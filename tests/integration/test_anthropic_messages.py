"""Anthropic Messages end to end: the official anthropic SDK against a real daemon (tiny-qwen, 192-token window)."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request

import anthropic
import pytest

from tests.integration.conftest import CONTEXT, TINY
from zllm.api.anthropic_messages.signature import sign_thinking

HELLO = [{"role": "user", "content": "Say hello."}]
# temperature is not a parameter of anthropic 2.14's create(); it still goes on the wire
GREEDY = {"temperature": 0}
# kept tiny: the template's tool preamble alone is ~100 of the window's 192 tokens
TOOLS = [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
# A short Claude-Code-shaped conversation: billing header, mid-conversation system turn, echoed thinking,
# a tool round trip with an errored result.
AGENT_BODY = {
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
               {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List files."}]},
        {"role": "system", "content": "Today is Monday."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use Bash.", "signature": sign_thinking(TINY, "Use Bash.")},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such dir",
                                      "is_error": True, "cache_control": {"type": "ephemeral"}}]},
    ],
    "tools": TOOLS,
    "thinking": {"type": "adaptive"},
}
# Claude Code's extras on generation requests (count_tokens bodies have none of them)
AGENT_EXTRAS = {"metadata": {"user_id": "{\"session_id\":\"s\"}"},
                "extra_body": {"context_management": {"edits": []}, "output_config": {"effort": "high"}}}


@pytest.fixture()
def claude(daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="test-key", max_retries=0, timeout=60)


def prompt_size(usage) -> int:
    """The whole prompt, however the prefix cache split it (Anthropic counts uncached input separately)."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_non_streaming_and_streaming_agree(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model=TINY, max_tokens=16, messages=HELLO, extra_body=GREEDY)
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 16)
    with claude.messages.stream(model=TINY, max_tokens=16, messages=HELLO, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == message.content[0].text
    assert (streamed.stop_reason, streamed.usage.output_tokens) == ("max_tokens", 16)
    assert prompt_size(streamed.usage) == prompt_size(message.usage)


def test_every_sse_frame_has_an_event_line(daemon) -> None:
    body = json.dumps({"model": TINY, "max_tokens": 4, "messages": HELLO, "stream": True}).encode()
    request = urllib.request.Request(f"{daemon.base_url}/v1/messages?beta=true", data=body,
                                     headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request, timeout=60) as response:
        frames = [frame for frame in response.read().decode().split("\n\n") if frame]
    events = [frame.split("\n")[0] for frame in frames if not frame.startswith(":")]
    assert all(event.startswith("event: ") for event in events), frames
    assert events[:2] == ["event: message_start", "event: ping"] and events[-1] == "event: message_stop"


def test_max_tokens_like_claude_code_is_clamped_to_the_window(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model=TINY, max_tokens=32000, messages=HELLO, extra_body=GREEDY)
    assert message.stop_reason == "max_tokens"
    assert prompt_size(message.usage) + message.usage.output_tokens == CONTEXT


def test_prompt_too_long_is_400_with_the_exact_message(claude: anthropic.Anthropic) -> None:
    long = [{"role": "user", "content": "hello " * (CONTEXT * 2)}]
    tokens = claude.messages.count_tokens(model=TINY, messages=long).input_tokens
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=TINY, max_tokens=32000, messages=long)
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"] == f"prompt is too long: {tokens} tokens > {CONTEXT} maximum"


def test_unknown_model_is_404(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.count_tokens(model="claude-opus-5-5", messages=HELLO)
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_count_tokens_equals_the_input_generation_reports(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model=TINY, **AGENT_BODY).input_tokens
    assert 20 < counted < CONTEXT
    message = claude.messages.create(model=TINY, max_tokens=4, **AGENT_BODY, **AGENT_EXTRAS)
    assert prompt_size(message.usage) == counted
    events = list(claude.messages.create(model=TINY, max_tokens=4, stream=True, **AGENT_BODY, **AGENT_EXTRAS))
    assert events[0].type == "message_start" and prompt_size(events[0].message.usage) == counted
    # message_delta adds the output; the input split stays message_start's (tests/integration/test_usage_once.py)
    assert events[-2].type == "message_delta" and events[-2].usage.input_tokens is None


def test_26_concurrent_count_tokens_like_claude_code_context(claude: anthropic.Anthropic) -> None:
    bodies = [AGENT_BODY if i % 2 else {"messages": [{"role": "user", "content": "foo"}], "tools": TOOLS}
              for i in range(26)]
    with concurrent.futures.ThreadPoolExecutor(26) as pool:
        counts = list(pool.map(lambda body: claude.messages.count_tokens(model=TINY, **body).input_tokens, bodies))
    assert len(set(counts[0::2])) == 1 and len(set(counts[1::2])) == 1
    assert counts[0] < counts[1]


def test_models_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    (model,) = claude.models.list().data
    assert (model.id, model.type, model.max_input_tokens) == (TINY, "model", CONTEXT)
