"""Working caches over preallocated buffers behave exactly like transformers' DynamicCache."""

import torch

from zllm.engine.torch.kv_layers import (
    PreallocatedLayer,
    cache_buffers,
    cache_state,
    supports_working_buffers,
    working_cache,
)
from zllm.engine.torch.runner import ModelRunner

IDS = list(range(2000, 2090))


def buffers(runner: ModelRunner, capacity: int):
    state = runner.probe_kv_state()  # [1, kv_heads, 1, head_dim] per tensor
    return tuple(tuple(t.new_zeros(*t.shape[:-2], capacity, t.shape[-1]) for t in layer) for layer in state)


def test_tiny_qwen_supports_working_buffers(tiny_qwen) -> None:
    assert supports_working_buffers(tiny_qwen.model.config)


def test_prefill_and_decode_match_dynamic_cache_even_when_growing(tiny_qwen) -> None:
    runner = ModelRunner(tiny_qwen.model, prefill_chunk=32)
    with torch.inference_mode():
        reference = runner.new_cache()
        want = runner.prefill(IDS, reference)
        cache = working_cache(runner.config, buffers(runner, 64), 0)  # 90 tokens outgrow 64
        got = runner.prefill(IDS, cache)
        assert torch.allclose(got, want, atol=1e-5)
        for _ in range(5):
            token = want.argmax().view(1, 1)
            want, got = runner.decode(token, reference), runner.decode(token, cache)
            assert torch.allclose(got, want, atol=1e-5)
    assert cache.get_seq_length() == reference.get_seq_length() == 95
    for (k, v), layer in zip(cache_state(cache), reference.layers):
        assert torch.allclose(k, layer.keys, atol=1e-5) and torch.allclose(v, layer.values, atol=1e-5)
    assert all(k.shape[-2] >= 95 for k, _ in cache_buffers(cache))


def test_a_prefilled_buffer_is_a_restored_prefix(tiny_qwen) -> None:
    runner = ModelRunner(tiny_qwen.model)
    with torch.inference_mode():
        full = runner.prefill(IDS, runner.new_cache())
        first = working_cache(runner.config, buffers(runner, 128), 0)
        runner.prefill(IDS[:50], first)
        restored = working_cache(runner.config, cache_buffers(first), 50)  # same buffers, 50 tokens filled
        assert torch.allclose(runner.prefill(IDS[50:], restored), full, atol=1e-5)


def test_crop_shortens_the_view() -> None:
    layer = PreallocatedLayer(torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), length=6)
    layer.crop(-2)
    assert layer.get_seq_length() == 4 and layer.keys.shape == (1, 2, 4, 4)


def test_growing_keeps_keys_and_values_their_own_width() -> None:
    # latent attention (DeepSeek's MLA) caches keys wider than values; outgrowing the buffers must keep both
    layer = PreallocatedLayer(torch.zeros(1, 2, 4, 24), torch.zeros(1, 2, 4, 16))
    first = (torch.randn(1, 2, 3, 24), torch.randn(1, 2, 3, 16))
    second = (torch.randn(1, 2, 3, 24), torch.randn(1, 2, 3, 16))
    layer.update(*first)
    keys, values = layer.update(*second)
    assert layer.capacity >= 6 and keys.shape == (1, 2, 6, 24) and values.shape == (1, 2, 6, 16)
    assert torch.equal(keys, torch.cat([first[0], second[0]], dim=2))
    assert torch.equal(values, torch.cat([first[1], second[1]], dim=2))
