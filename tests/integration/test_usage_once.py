"""Usage counts the prompt exactly once, in every API, streamed or not, against a real daemon: cold, on a
device-tier hit (the same prefix again) and on an SSD hit after a restart (issue 20).

Anthropic streams are merged the ways clients merge them (tests/support/usage_merges.py: Claude Code's,
the SDK's, a plain override, a sum) and through the real anthropic SDK's stream helper; Chat and Responses
through the openai SDK's stream helpers; Ollama's final NDJSON chunk directly."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon
from tests.support.usage_merges import MERGES, fold, prompt_counted

SYSTEM = "You are a coding agent. Keep answers short and follow the repository's conventions. " * 4
GREEDY = {"temperature": 0}
KEY = "usage-key"


def start(tiny_data_dir, cache_dir) -> Daemon:
    env = {"ZLLM_CACHE_DIR": str(cache_dir), "ZLLM_SSD_MIN_TOKENS": "1"}
    return Daemon(tiny_data_dir, TINY, "--context-length", "1024", env=env).wait_ready()


def claude(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0, timeout=60)


def streamed_frames(daemon: Daemon, messages: list[dict]) -> list[dict]:
    """The raw SSE data objects of a streamed Messages answer (comments and event lines dropped)."""
    body = {"model": TINY, "max_tokens": 4, "system": SYSTEM, "messages": messages, "stream": True, **GREEDY}
    request = urllib.request.Request(f"{daemon.base_url}/v1/messages", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", "x-api-key": KEY})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    return [json.loads(line[len("data: "):]) for line in text.split("\n") if line.startswith("data: ")]


def assert_anthropic_counts_once(daemon: Daemon, messages: list[dict]) -> dict:
    """Every merge of a streamed answer, the SDK's stream helper and the non-streamed answer: input +
    cache_creation + cache_read is the prompt count_tokens gives. Returns the first stream's merged usage."""
    sdk = claude(daemon)
    counted = sdk.messages.count_tokens(model=TINY, system=SYSTEM, messages=messages).input_tokens
    frames = streamed_frames(daemon, messages)
    merged = {name: fold(merge, frames) for name, merge in MERGES.items()}
    assert {name: prompt_counted(usage) for name, usage in merged.items()} == dict.fromkeys(MERGES, counted)
    first = merged["claude_code"]
    assert all(usage["cache_read_input_tokens"] == first["cache_read_input_tokens"] for usage in merged.values())
    with sdk.messages.stream(model=TINY, max_tokens=4, system=SYSTEM, messages=messages,
                             extra_body=GREEDY) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.input_tokens + streamed.cache_creation_input_tokens + streamed.cache_read_input_tokens == counted
    whole = sdk.messages.create(model=TINY, max_tokens=4, system=SYSTEM, messages=messages, extra_body=GREEDY).usage
    assert whole.input_tokens + whole.cache_creation_input_tokens + whole.cache_read_input_tokens == counted
    # the second and third asks of the same prompt find all of it but its last token on the device tier
    assert streamed.cache_read_input_tokens == whole.cache_read_input_tokens == counted - 1
    return first | {"counted": counted}


def assert_openai_and_ollama_count_once(daemon: Daemon, messages: list[dict], counted: int) -> None:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)
    chat_messages = [{"role": "system", "content": SYSTEM}, *messages]
    chunks = list(client.chat.completions.create(model=TINY, messages=chat_messages, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    usages = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert len(usages) == 1 and usages[0].prompt_tokens == counted  # one usage chunk: nothing to add up
    assert usages[0].prompt_tokens_details.cached_tokens == counted - 1
    with client.chat.completions.stream(model=TINY, messages=chat_messages, max_tokens=4,
                                        stream_options={"include_usage": True}, **GREEDY) as stream:
        for _ in stream:  # (get_final_completion() refuses a length-cut answer; the snapshot is the same fold)
            pass
        assert stream.current_completion_snapshot.usage.prompt_tokens == counted
    with client.responses.stream(model=TINY, instructions=SYSTEM, input=messages, max_output_tokens=4,
                                 **GREEDY) as stream:
        events = list(stream)
    carried = {event.type: event.response.usage for event in events if hasattr(event, "response")}
    # usage only on the terminal event (cut by max_output_tokens: response.incomplete, else completed)
    assert list(carried) == ["response.created", "response.in_progress", "response.incomplete"]
    assert carried["response.created"] is None and carried["response.in_progress"] is None
    assert carried["response.incomplete"].input_tokens == counted
    assert carried["response.incomplete"].input_tokens_details.cached_tokens == counted - 1
    body = {"model": TINY, "messages": chat_messages, "stream": True, "options": {**GREEDY, "num_predict": 4}}
    request = urllib.request.Request(f"{daemon.base_url}/api/chat", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]
    assert [line.get("prompt_eval_count") for line in lines] == [None] * (len(lines) - 1) + [counted]


@pytest.mark.timeout(300)
def test_every_api_counts_the_prompt_once_cold_on_a_device_hit_and_on_an_ssd_hit(tiny_data_dir, tmp_path) -> None:
    cache_dir = tmp_path / "cache"
    first_turn = [{"role": "user", "content": "Add a test for the parser."}]
    daemon = start(tiny_data_dir, cache_dir)
    try:
        cold = assert_anthropic_counts_once(daemon, first_turn)
        assert cold["cache_read_input_tokens"] == 0 and cold["input_tokens"] == 0  # all of it prefilled and kept
        second_turn = [*first_turn, {"role": "assistant", "content": "Done."},
                       {"role": "user", "content": "Now run it."}]
        device = assert_anthropic_counts_once(daemon, second_turn)
        assert 0 < device["cache_read_input_tokens"] < device["counted"]  # the first turn came from the device
        assert daemon.logged("cached (device)")
        assert_openai_and_ollama_count_once(daemon, second_turn, device["counted"])
    finally:
        daemon.stop()  # SIGTERM: queued snapshot writes finish before exit

    third_turn = [*second_turn, {"role": "assistant", "content": "It passes."},
                  {"role": "user", "content": "Commit it."}]
    daemon = start(tiny_data_dir, cache_dir)
    try:
        ssd = assert_anthropic_counts_once(daemon, third_turn)
        assert 0 < ssd["cache_read_input_tokens"] < ssd["counted"] and daemon.logged("cached (ssd)")
    finally:
        daemon.stop()
