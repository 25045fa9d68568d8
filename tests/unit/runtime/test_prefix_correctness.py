"""Restored state is the state: logits after restore + append prefill equal a full prefill (fp32, 1e-4) and greedy
continuations are identical, for device-tier and SSD hits at several append boundaries."""

import random

import pytest
import torch

from zllm.engine.torch.kv_layers import cache_state
from zllm.engine.torch.runner import ModelRunner
from zllm.kvcache import CacheConfig
from zllm.runtime.prefix import build_prefix_cache

NS = "ns"
BASE = tuple(random.Random(5).randrange(1000, 100_000) for _ in range(600))
NEW = tuple(random.Random(6).randrange(1000, 100_000) for _ in range(7))
# (tokens of BASE the prompt starts with, tokens appended): a prefix inside BASE, BASE itself, BASE plus more
BOUNDARIES = [(1, NEW), (100, NEW), (599, NEW), (600, NEW), (600, ()), (350, ())]


def greedy(runner: ModelRunner, logits: torch.Tensor, cache, n: int = 8) -> list[int]:
    out = []
    for _ in range(n):
        token = logits.argmax().view(1, 1)
        out.append(int(token))
        logits = runner.decode(token, cache)
    return out


def keep(cache, runner: ModelRunner, tokens, rid: str) -> None:
    """Put `tokens` in the cache the way the engine does: lease, prefill, finish."""
    lease = cache.acquire(NS, tokens, max_new_tokens=1)
    kv = runner.open(lease)
    runner.prefill(tokens[lease.cached_tokens:], kv)
    cache.finish(lease, tokens, cache_state(kv), entry_id=rid, prompt_length=len(tokens))


def check_restores(cache, runner: ModelRunner, expected_tier: str) -> None:
    for keep_tokens, appended in BOUNDARIES:
        prompt = BASE[:keep_tokens] + appended
        reference_cache = runner.new_cache()
        reference = runner.prefill(prompt, reference_cache)
        lease = cache.acquire(NS, prompt, max_new_tokens=8)
        assert lease.cached_tokens == min(keep_tokens, len(prompt) - 1)  # the last token is always prefilled
        assert lease.tier == (expected_tier if lease.cached_tokens else "cold")
        kv = runner.open(lease)
        logits = runner.prefill(prompt[lease.cached_tokens:], kv)
        assert (logits - reference).abs().max().item() < 1e-4, (keep_tokens, len(appended))
        assert greedy(runner, logits, kv) == greedy(runner, reference, reference_cache)
        cache.release(lease)


@pytest.fixture
def runner(tiny_qwen) -> ModelRunner:
    return ModelRunner(tiny_qwen.model, prefill_chunk=256)  # chunk boundaries inside the prompts too


def test_device_tier_hits_equal_full_prefill(tiny_qwen, runner) -> None:
    cache = build_prefix_cache(tiny_qwen, CacheConfig(device_budget_bytes=64 << 20))
    with torch.inference_mode():
        keep(cache, runner, BASE, "base")
        check_restores(cache, runner, "device")
    cache.check_integrity()
    cache.close()


def test_ssd_tier_hits_equal_full_prefill_after_a_restart(tiny_qwen, runner, tmp_path) -> None:
    config = CacheConfig(device_budget_bytes=64 << 20, ssd_dir=tmp_path / "kv", ssd_min_tokens=1)
    first = build_prefix_cache(tiny_qwen, config)
    with torch.inference_mode():
        keep(first, runner, BASE, "base")
    first.close()  # drains the writer
    restarted = build_prefix_cache(tiny_qwen, config)
    with torch.inference_mode():
        check_restores(restarted, runner, "ssd")
    restarted.check_integrity()
    restarted.close()
