"""Codex-style compaction through a real daemon and the openai SDK: a conversation compacted (the summary
request itself served from the prefix cache), continued from the compaction item, then the daemon restarted
and continued again: the item still opens (the install key is kept in the state dir) and the compacted
prefix comes from the cache each turn after its first (device tier, then the SSD tier after the restart);
then the streamed `compaction_trigger` form."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.integration.conftest import TINY, linked_data_dir
from tests.support.daemon import Daemon

DEVELOPER = {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent. Keep changes small. " * 8}]}
GREEDY = {"temperature": 0, "max_output_tokens": 8}


def start(shared_data: Path, where: Path) -> Daemon:
    env = {"ZLLM_STATE_DIR": str(where / "state"), "ZLLM_CACHE_DIR": str(where / "cache"),
           "ZLLM_SSD_MIN_TOKENS": "1"}
    return Daemon(linked_data_dir(shared_data, where), TINY, "--context-length", "1024", env=env).wait_ready()


def sdk(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=120)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def turn(client: openai.OpenAI, items: list[dict]) -> tuple[list[dict], int, int]:
    """One turn over the full history (as Codex sends it): the history with the answer, prompt and cached tokens."""
    response = client.responses.create(model=TINY, input=items, store=False, **GREEDY)
    answer = [item.model_dump(exclude_none=True) for item in response.output]
    return [*items, *answer], response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens



@pytest.mark.timeout(300)
def test_compacted_continued_restarted_and_continued_with_cache_hits(tiny_data_dir: Path, tmp_path: Path) -> None:
    daemon = start(tiny_data_dir, tmp_path)
    try:
        client = sdk(daemon)
        history, _, _ = turn(client, [DEVELOPER, user("Add a test for the parser.")])
        compacted = client.responses.compact(model=TINY, input=history, extra_body=GREEDY)
        assert compacted.usage.input_tokens_details.cached_tokens > 0  # the summary request reused the turn
        *kept, item = compacted.output
        assert [k.content[0].text for k in kept] == ["Add a test for the parser."] and item.type == "compaction"

        after = [item.model_dump(exclude_none=True), DEVELOPER, user("Go on.")]
        after, first_prompt, _ = turn(client, after)            # the first expansion: computed
        after, _, cached = turn(client, [*after, user("Run it.")])
        assert cached >= first_prompt  # the compacted prefix (and the whole first turn) came from the cache
        assert daemon.logged("cached (device)")
    finally:
        daemon.stop()  # SIGTERM: queued snapshot writes finish before exit

    daemon = start(tiny_data_dir, tmp_path)
    try:
        client = sdk(daemon)
        _, prompt, cached = turn(client, [*after, user("Commit it.")])
        assert first_prompt <= cached < prompt and daemon.logged("cached (ssd)")
        streamed_trigger_then_a_turn(client)
    finally:
        daemon.stop()


def streamed_trigger_then_a_turn(client: openai.OpenAI) -> None:
    """Codex's newer form: `compaction_trigger` ends the input; one compaction item comes back, and the next
    turn starts from it."""
    events = list(client.responses.create(model=TINY, stream=True, store=False, **GREEDY,
                                          input=[DEVELOPER, user("Add a test."), {"type": "compaction_trigger"}]))
    completed = events[-1].response
    assert events[-1].type == "response.completed" and [i.type for i in completed.output] == ["compaction"]
    item = completed.output[0].model_dump(exclude_none=True)
    follow_up = client.responses.create(model=TINY, input=[item, user("Go on.")], store=False, **GREEDY)
    # the summary came back in as the conversation's start (its fixed header alone is some 30 tokens)
    assert follow_up.status in ("completed", "incomplete") and follow_up.usage.input_tokens > 30
