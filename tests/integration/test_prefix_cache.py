"""The prefix cache through a real daemon: multi-turn hits, a restart served from the SSD tier with the same
answer as a cold run, and callers (API keys) that never share a cache."""

from __future__ import annotations


import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon

SYSTEM = "You are a coding agent. Follow the repository's conventions. " * 12


def start(tiny_data_dir, cache_dir) -> Daemon:
    env = {"ZLLM_CACHE_DIR": str(cache_dir), "ZLLM_SSD_MIN_TOKENS": "1"}
    return Daemon(tiny_data_dir, TINY, "--context-length", "1024", env=env).wait_ready()



def sdk(daemon: Daemon, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def turn(client: openai.OpenAI, messages: list[dict]) -> tuple[str, int, int]:
    completion = client.chat.completions.create(model=TINY, messages=messages, temperature=0, max_tokens=12)
    usage = completion.usage
    return completion.choices[0].message.content, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


@pytest.mark.timeout(240)
def test_conversation_survives_a_restart_from_the_ssd_tier(tiny_data_dir, tmp_path) -> None:
    cache_dir = tmp_path / "cache"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Add a test."}]
    daemon = start(tiny_data_dir, cache_dir)
    try:
        alice = sdk(daemon, "alice")
        answer1, prompt1, cached1 = turn(alice, messages)
        assert cached1 == 0
        messages += [{"role": "assistant", "content": answer1}, {"role": "user", "content": "Run it."}]
        answer2, _, cached2 = turn(alice, messages)
        assert cached2 > prompt1  # turn 1's prompt and most of its answer came from the device tier
        assert daemon.logged("cached (device)")
    finally:
        daemon.stop()  # SIGTERM: queued snapshot writes finish before exit

    messages += [{"role": "assistant", "content": answer2}, {"role": "user", "content": "Commit it."}]
    daemon = start(tiny_data_dir, cache_dir)
    try:
        answer3, prompt3, cached3 = turn(sdk(daemon, "alice"), messages)
        assert 0 < cached3 < prompt3 and daemon.logged("cached (ssd)")
        cold3, _, cold_cached = turn(sdk(daemon, "bob"), messages)  # another caller: its own, empty namespace
        assert cold_cached == 0 and cold3 == answer3
    finally:
        daemon.stop()
