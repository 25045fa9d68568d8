"""The prefix cache is exact on the default model (issue 22): the same prompts answered cold, from the device tier
and from the SSD tier after a restart give the same greedy tokens, with other conversations in the cache.

The reference is a daemon with both cache tiers off (every request a cold prefill); the daemon under test keeps
other conversations beside the probes in its KV pool, answers each probe first cold, then again from its device
tier, then turn 2 of the conversation on the cached turn 1 + answer (whose KV the one-token decode steps made),
and after a restart both again from the SSD tier. bench/cache_exactness.py measures the logits behind it."""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

from tests.support.daemon import Daemon  # noqa: E402
from tests.support.default_gguf import NAME, default_model_data_dir  # noqa: E402

NEW_TOKENS = 64
SYSTEM = ("You are a coding agent working in a repository. Follow the user's instructions exactly, keep answers "
          "short, and use the tools when a file must be read. ") * 4
CODE = ("def step(self, rows):\n    feeds = [(row.seq, t) for row in rows for t in row.token_ids]\n"
        "    return self._decode(feeds)  # one llama_decode per batch\n")


def probe(i: int) -> list[dict]:
    """An agent-shaped conversation (~700 tokens): a system prompt, file reads, a question."""
    messages = [{"role": "system", "content": SYSTEM}]
    for j in range(4):
        messages += [{"role": "user", "content": f"Read src/mod_{i}_{j}.py"},
                     {"role": "assistant", "content": f"Here is src/mod_{i}_{j}.py:\n{CODE * (2 + i)}"}]
    return messages + [{"role": "user", "content": "Which function feeds the tokens, and what does it return?"}]


def other(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Conversation {i}: tell me about the weather in Lisbon. " * 30}]


def ask(client: openai.OpenAI, messages: list[dict]) -> tuple[str, int]:
    reply = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=NEW_TOKENS)
    return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens


def turn2(messages: list[dict], answer: str) -> list[dict]:
    return messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in one word?"}]


def serve(data_dir, env: dict) -> tuple[Daemon, openai.OpenAI]:
    daemon = Daemon(data_dir, NAME, env={"ZLLM_THREADS": "1", "ZLLM_EXACT_CACHE": "true", **env}).wait_ready(timeout=180)
    return daemon, openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_cold_device_hit_and_ssd_hit_answer_alike(tmp_path) -> None:
    data_dir = default_model_data_dir()
    probes = [probe(1)]  # one conversation: each is ~4 min of exact-attention prefill on one thread in CI
    daemon, client = serve(data_dir, {"ZLLM_CACHE_ROUNDS": "0", "ZLLM_SSD_CACHE": "false",
                                      "ZLLM_CACHE_DIR": str(tmp_path / "off")})
    try:
        cold = [ask(client, messages)[0] for messages in probes]
        cold2 = [ask(client, turn2(messages, answer))[0] for messages, answer in zip(probes, cold)]
    finally:
        assert daemon.stop() == 0
    assert all(cold) and len(set(cold)) == len(cold)

    env = {"ZLLM_CACHE_DIR": str(tmp_path / "cache"), "ZLLM_SSD_MIN_TOKENS": "64"}
    daemon, client = serve(data_dir, env)
    try:
        for i, (messages, answer, answer2) in enumerate(zip(probes, cold, cold2)):
            ask(client, other(i))  # another conversation's cells sit before this one's in the pool
            assert ask(client, messages)[0] == answer, "cold beside another conversation (the system prompt hits)"
            text, cached = ask(client, messages)
            assert cached > 0 and text == answer, "device-tier hit on the same prompt"
            text, cached = ask(client, turn2(messages, answer))
            assert cached > 0 and text == answer2, "device-tier hit on turn 1 + its answer"
    finally:
        assert daemon.stop() == 0
    daemon, client = serve(data_dir, env)
    try:
        ask(client, other(9))
        for messages, answer, answer2 in zip(probes, cold, cold2):
            text, cached = ask(client, turn2(messages, answer))
            assert cached > 0 and text == answer2, "SSD hit after a restart"
        assert daemon.control().cache_stats()["ssd_hits"] >= len(probes)
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast"])
def test_logits_do_not_depend_on_placement_or_hits_in_the_engine(exact: bool) -> None:
    """The same tokens' logits, engine alone: cold alone, cold with another sequence's cells before it, and a
    continuation of a kept prefix (shared with seq_cp, and exported + imported like the SSD tier) are equal
    bit for bit under EXACT_ATTENTION; under FAST_ATTENTION (F16 cells, llama.cpp's tiled kernel) they are not,
    which is what this test would miss if the exact configuration stopped being used."""
    from tests.support.default_gguf import default_gguf_file
    from zllm.engine.contract import Row
    from zllm.engine.llamacpp.backend import EXACT_ATTENTION, FAST_ATTENTION, ContextSettings, LlamaCppEngine

    attention = EXACT_ATTENTION if exact else FAST_ATTENTION
    settings = ContextSettings(cells=4096, threads=1, flash_attention=attention.flash_attention,
                               kv_type=attention.kv_type)
    gguf = str(default_gguf_file())
    ids = [(7 * i + 3) % 30000 + 100 for i in range(300)]
    other = [(11 * i + 5) % 30000 + 100 for i in range(333)]

    def run(engine, seq, tokens):
        logits = None
        for start in range(0, len(tokens), 128):
            (logits,) = engine.step([Row(seq, tokens[start:start + 128])])
        return logits

    engine = LlamaCppEngine(gguf, settings)
    try:
        cold = run(engine, engine.open(), ids)
    finally:
        engine.close()
    engine = LlamaCppEngine(gguf, settings)
    try:
        run(engine, engine.open(), other)  # its cells come first: ours start at cell 333
        first = engine.open()
        beside = run(engine, first, ids)
        hit = run(engine, engine.share(first, 200), ids[200:])
        saved = bytearray(engine.export_state(first))
    finally:
        engine.close()
    engine = LlamaCppEngine(gguf, settings)
    try:
        run(engine, engine.open(), other[:77])
        more = ids[-2:]  # 2 rows, not 1: an F16 model's matmul takes another kernel for a 1-row batch (README)
        restored = run(engine, engine.import_state(saved, len(ids)), more)
        again = run(engine, engine.open(), ids + more)
    finally:
        engine.close()
    gaps = [float(np.max(np.abs(a - b))) for a, b in ((cold, beside), (cold, hit), (restored, again))]
    if exact:
        assert gaps == [0.0, 0.0, 0.0]
    else:
        assert max(gaps) > 0.01, gaps


@pytest.mark.xfail(strict=True, reason="llama.cpp refills from cell 0 when the space before its cursor is large: "
                   "a continuation lands before its cached prefix and the per-cell kernel sums in another order")
def test_a_continuation_after_a_hole_before_its_prefix_is_still_exact() -> None:
    """The bound README states (0.88 on the bench's prompts): cells released before a kept prefix, then a
    continuation of it. Strict: when llama.cpp places cells in position order, this passes and must be unmarked."""
    from tests.support.default_gguf import default_gguf_file
    from zllm.engine.contract import Row
    from zllm.engine.llamacpp.backend import EXACT_ATTENTION, ContextSettings, LlamaCppEngine

    settings = ContextSettings(cells=4096, threads=1, flash_attention=EXACT_ATTENTION.flash_attention,
                               kv_type=EXACT_ATTENTION.kv_type)
    gguf = str(default_gguf_file())
    ids = [(7 * i + 3) % 30000 + 100 for i in range(300)]
    engine = LlamaCppEngine(gguf, settings)
    try:
        (cold,) = engine.step([Row(engine.open(), ids)])
        other = engine.open()
        engine.step([Row(other, ids[:250])])
        first = engine.open()
        engine.step([Row(first, ids[:200])])
        engine.release(other)  # 250 free cells before `first`'s: the next cells go there
        (hit,) = engine.step([Row(engine.share(first, 200), ids[200:])])
    finally:
        engine.close()
    assert float(np.max(np.abs(cold - hit))) == 0.0
