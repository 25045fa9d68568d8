"""`SequencePrefixCache` over a real llama.cpp engine (tiny random-weight GGUF): device hits share the cached
prefix, SSD snapshots restore after a restart, damaged snapshots are set aside and served cold, and the pool
budget holds. Logits are compared as in tests/unit/engine/test_llamacpp_backend.py (llama.cpp's tolerance)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from zllm.cache_views import PruneCounts  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402
from zllm.kvcache import CacheConfig  # noqa: E402
from zllm.kvcache.sequence_cache import SequencePrefixCache  # noqa: E402

TURN1 = [(i * 31) % 400 + 30 for i in range(100)]
TURN2 = TURN1 + [(i * 17) % 300 + 40 for i in range(40)]
NS = "ns"


def new_engine(path, cells=2048) -> LlamaCppEngine:
    return LlamaCppEngine(str(path), ContextSettings(cells=cells, threads=1, max_sequences=16))


def new_cache(engine, tmp_path=None, **config) -> SequencePrefixCache:
    defaults = dict(device_budget_bytes=engine.kv_bytes, ssd_dir=tmp_path / "kv" if tmp_path else None,
                    ssd_min_tokens=16)
    return SequencePrefixCache(CacheConfig(**{**defaults, **config}), engine, cells=engine.cells,
                               bytes_per_token=engine.bytes_per_token, layout="tiny", spare_sequences=2)


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


def prompt_logits(engine, cache, prompt, rid):
    lease = cache.acquire(NS, prompt, request_id=rid)
    seq = engine.open(lease)
    logits = engine.step([Row(seq, prompt[lease.cached_tokens:])])[0]
    cache.release(lease)
    return lease, logits


def fresh_logits(engine, prompt, split):
    seq = engine.open()
    if split:
        engine.step([Row(seq, prompt[:split])])
    logits = engine.step([Row(seq, prompt[split:])])[0]
    engine.release(seq)
    return logits


def assert_close(a, b, tolerance=1e-4):
    assert np.abs(a - b).max() <= tolerance * np.abs(b).max()
    assert int(a.argmax()) == int(b.argmax())


@pytest.fixture
def engine(tiny_gguf_path):
    engine = new_engine(tiny_gguf_path("llama-bpe"))
    yield engine
    engine.close()


def test_turn_two_shares_turn_one_and_continues_as_a_fresh_prefill(engine) -> None:
    cache = new_cache(engine)
    first = run(engine, cache, TURN1, "r1", generate=0)
    assert first.tier == "cold"
    lease, logits = prompt_logits(engine, cache, TURN2, "r2")
    assert (lease.tier, lease.cached_tokens) == ("device", len(TURN1))
    assert_close(logits, fresh_logits(engine, TURN2, len(TURN1)))
    stats = cache.stats()
    assert stats.device_hits == 1 and stats.entries == 1
    cache.check_integrity()


def test_the_same_prompt_again_prefills_only_its_last_token(engine) -> None:
    cache = new_cache(engine)
    run(engine, cache, TURN1, "r1", generate=0)
    lease, _ = prompt_logits(engine, cache, TURN1, "r2")
    assert lease.cached_tokens == len(TURN1) - 1


def test_ssd_snapshot_restores_after_a_restart(engine, tiny_gguf_path, tmp_path) -> None:
    cache = new_cache(engine, tmp_path)
    run(engine, cache, TURN1, "r1", generate=0)
    cache.close()
    restarted = new_engine(tiny_gguf_path("llama-bpe"))
    try:
        again = new_cache(restarted, tmp_path)
        assert again.stats().ssd.snapshots == 1
        lease, logits = prompt_logits(restarted, again, TURN2, "r2")
        assert (lease.tier, lease.cached_tokens) == ("ssd", len(TURN1))
        assert_close(logits, fresh_logits(restarted, TURN2, len(TURN1)))
        again.close()
    finally:
        restarted.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "nan", "directory"])
def test_a_damaged_snapshot_is_set_aside_and_served_cold(engine, tiny_gguf_path, tmp_path, damage) -> None:
    cache = new_cache(engine, tmp_path)
    run(engine, cache, TURN1, "r1", generate=0)
    cache.close()
    (blob,) = (tmp_path / "kv" / "blobs").iterdir()
    data = bytearray(blob.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "nan":
        data[-64:] = b"\xff" * 64
    if damage == "directory":
        blob.unlink()
        blob.mkdir()
    else:
        blob.write_bytes(bytes(data))
    restarted = new_engine(tiny_gguf_path("llama-bpe"))
    try:
        again = new_cache(restarted, tmp_path)
        lease, logits = prompt_logits(restarted, again, TURN2, "r2")
        assert (lease.tier, lease.cached_tokens) == ("cold", 0)
        assert_close(logits, fresh_logits(restarted, TURN2, 0))
        stats = again.stats()
        assert stats.ssd.snapshots == 0
        assert any((tmp_path / "kv" / "quarantine").iterdir()), "the damaged blob is kept aside, not deleted"
        again.close()
    finally:
        restarted.close()


def test_a_garbage_index_is_set_aside_and_the_tier_starts_empty(engine, tmp_path) -> None:
    (tmp_path / "kv").mkdir()
    (tmp_path / "kv" / "index.sqlite").write_bytes(b"this is not a database" * 100)
    cache = new_cache(engine, tmp_path)
    assert cache.stats().ssd.snapshots == 0
    run(engine, cache, TURN1, "r1", generate=0)
    cache.flush()
    assert cache.stats().ssd.snapshots == 1
    cache.close()


def test_the_pool_budget_evicts_least_recently_used_entries(tiny_gguf_path) -> None:
    engine = new_engine(tiny_gguf_path("llama-bpe"), cells=512)
    try:
        cache = new_cache(engine)
        prompts = [[(i * k) % 300 + 30 for i in range(150)] for k in (3, 5, 7, 11, 13)]
        for n, prompt in enumerate(prompts):
            assert cache.admission_need(len(prompt), 4) <= cache.admission_room()
            run(engine, cache, prompt, f"r{n}", generate=2)
            held = sum(e.tokens for e in cache.entries() if e.tier == "device")
            assert held <= engine.cells
        assert len(cache.entries()) < len(prompts)
        assert cache.admission_need(600, 4) > cache.admission_room()
        cache.check_integrity()
    finally:
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
