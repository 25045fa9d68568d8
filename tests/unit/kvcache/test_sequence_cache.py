"""The prefix cache over llama.cpp's KV (engine/llamacpp/kv.py) and a real engine (tiny random-weight GGUF), where it
differs from torch's: its entries are the engine's sequences, given back when nothing keeps them. What both caches
must do (hits, restores ≡ full prefill, eviction, near misses, damage) is tests/unit/kvcache/test_cache_contract.py."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from zllm.cache_views import PruneCounts  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402
from zllm.kvcache import CacheConfig  # noqa: E402
from zllm.engine.llamacpp.kv import LlamaKV  # noqa: E402
from zllm.kvcache.prefix_cache import PrefixCache  # noqa: E402

TURN1 = [(i * 31) % 400 + 30 for i in range(100)]
TURN2 = TURN1 + [(i * 17) % 300 + 40 for i in range(40)]
NS = "ns"


def new_engine(path, cells=2048) -> LlamaCppEngine:
    return LlamaCppEngine(str(path), ContextSettings(cells=cells, threads=1, max_sequences=16))


def new_cache(engine, tmp_path=None, **config) -> PrefixCache:
    defaults = dict(device_budget_bytes=engine.kv_bytes, ssd_dir=tmp_path / "kv" if tmp_path else None,
                    ssd_min_tokens=16)
    return PrefixCache(CacheConfig(**{**defaults, **config}), LlamaKV(engine, layout="tiny", spare_sequences=2),
                       cost_key="cost:seq:tiny", budget_bytes=engine.kv_bytes)


def run(engine, cache, prompt, rid, generate=3):
    """One request through the cache as the engine loop runs it: prefill, greedy decode, keep. Returns the lease."""
    lease = cache.acquire(NS, prompt, max_new_tokens=generate, request_id=rid)
    seq = engine.open(lease)
    logits = engine.step([Row(seq, prompt[lease.cached_tokens:])])[0]
    generated = []
    for _ in range(generate):
        generated.append(int(logits.argmax()))
        logits = engine.step([Row(seq, generated[-1:])])[0]
    held = engine.length(seq)
    cache.finish(lease, (*prompt, *generated)[:held], seq, entry_id=rid, prompt_length=len(prompt))
    return lease


@pytest.fixture(scope="module")
def engine(tiny_gguf_path):
    engine = new_engine(tiny_gguf_path("llama-bpe"))
    yield engine
    engine.close()


def test_rounds_zero_keeps_nothing(engine) -> None:
    free = engine.free_sequences
    cache = new_cache(engine, rounds=0)
    run(engine, cache, TURN1, "r1", generate=1)
    assert cache.entries() == [] and engine.free_sequences == free


def test_prune_by_namespace_and_size_gives_sequences_back(engine) -> None:
    free = engine.free_sequences
    cache = new_cache(engine)
    run(engine, cache, TURN1, "r1", generate=0)
    run(engine, cache, [t + 1 for t in TURN1], "r2", generate=0)
    assert cache.prune(namespace="other") == PruneCounts(device_freed_bytes=0, ssd_removed=0)
    freed = cache.prune(max_bytes=len(TURN1) * engine.bytes_per_token).device_freed_bytes
    assert freed == len(TURN1) * engine.bytes_per_token and [e.id for e in cache.entries()] == ["r2"]
    cache.prune(namespace=NS)
    assert cache.entries() == []
    cache.acquire(NS, TURN2, request_id="r3")  # the engine thread gives pruned sequences back here
    assert engine.free_sequences == free - 1
