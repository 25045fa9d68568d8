"""Sampler: greedy is argmax, seeds reproduce, top-k / top-p cut the candidates, temperature reshapes."""

import math
from collections import Counter

import pytest
import torch

from zllm.engine.sampler import Sampler, SamplingConfig

VOCAB = 151936


def draw(config: SamplingConfig, logits: torch.Tensor, n: int) -> list[int]:
    sampler = Sampler(config)
    return [int(sampler(logits)) for _ in range(n)]


def frequencies(samples: list[int]) -> dict[int, float]:
    return {token: count / len(samples) for token, count in Counter(samples).items()}


def test_returns_a_1x1_long_tensor_ready_for_the_next_decode() -> None:
    token = Sampler(SamplingConfig(temperature=0.7, seed=1))(torch.randn(VOCAB))
    assert token.shape == (1, 1) and token.dtype == torch.long and 0 <= int(token) < VOCAB


def test_temperature_zero_is_argmax() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(VOCAB, generator=gen)
        assert int(Sampler(SamplingConfig(temperature=0.0))(logits)) == int(logits.argmax())


def test_top_k_one_is_greedy_even_at_high_temperature() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    assert set(draw(SamplingConfig(temperature=5.0, top_k=1, seed=3), logits, 50)) == {int(logits.argmax())}


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))  # flat-ish: many candidates
    a = draw(SamplingConfig(temperature=1.0, seed=42), logits, 30)
    b = draw(SamplingConfig(temperature=1.0, seed=42), logits, 30)
    c = draw(SamplingConfig(temperature=1.0, seed=43), logits, 30)
    assert a == b
    assert a != c


def test_unseeded_samplers_are_not_all_identical() -> None:
    logits = torch.zeros(VOCAB)
    assert draw(SamplingConfig(temperature=1.0), logits, 10) != draw(SamplingConfig(temperature=1.0), logits, 10)


def test_seed_is_independent_of_the_global_rng() -> None:
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    a = draw(SamplingConfig(seed=7), logits, 20)
    torch.manual_seed(999)
    torch.rand(100)
    assert draw(SamplingConfig(seed=7), logits, 20) == a


# probabilities 0.5, 0.3, 0.15, 0.05 at scattered ids inside a larger vocabulary (rest ~ 0)
PROBS = {17: 0.5, 3: 0.3, 900: 0.15, 42: 0.05}


def known_logits(vocab: int = 1000) -> torch.Tensor:
    logits = torch.full((vocab,), -1e9)
    for token, p in PROBS.items():
        logits[token] = math.log(p)
    return logits


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    samples = draw(SamplingConfig(temperature=1.0, top_p=0.7, seed=0), known_logits(), 3000)
    freq = frequencies(samples)
    assert set(freq) == {17, 3}  # 0.5 < 0.7, then 0.5 + 0.3 reaches it: 900 and 42 are cut
    assert freq[17] == pytest.approx(0.5 / 0.8, abs=0.04)  # renormalized inside the kept set


def test_top_p_always_keeps_the_most_likely_token() -> None:
    assert set(draw(SamplingConfig(temperature=1.0, top_p=0.01, seed=0), known_logits(), 200)) == {17}


def test_top_p_one_keeps_everything() -> None:
    assert set(draw(SamplingConfig(temperature=1.0, top_p=1.0, seed=0), known_logits(), 4000)) == set(PROBS)


def test_top_k_keeps_the_k_most_likely() -> None:
    freq = frequencies(draw(SamplingConfig(temperature=1.0, top_k=2, seed=0), known_logits(), 3000))
    assert set(freq) == {17, 3}
    assert freq[17] == pytest.approx(0.5 / 0.8, abs=0.04)


def test_top_k_and_top_p_combine() -> None:
    # top_k=3 keeps 0.5/0.3/0.15 (renormalized 0.526/0.316/0.158); top_p=0.6 then keeps the first two
    samples = draw(SamplingConfig(temperature=1.0, top_k=3, top_p=0.6, seed=0), known_logits(), 500)
    assert set(samples) == {17, 3}


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_the_distribution(temperature: float) -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    expected = torch.softmax(logits / temperature, dim=-1)
    freq = frequencies(draw(SamplingConfig(temperature=temperature, seed=11), logits, 4000))
    for token in range(4):
        assert freq.get(token, 0.0) == pytest.approx(float(expected[token]), abs=0.03)


def test_tiny_temperature_is_practically_greedy() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(9))
    assert set(draw(SamplingConfig(temperature=1e-4, seed=1), logits, 20)) == {int(logits.argmax())}


def test_masked_tokens_are_never_sampled_even_with_infinite_logits_elsewhere() -> None:
    logits = torch.full((100,), float("-inf"))
    logits[[5, 6]] = 0.0
    assert set(draw(SamplingConfig(temperature=1.0, seed=0), logits, 300)) == {5, 6}


def test_half_precision_logits_are_sampled_in_float32() -> None:
    logits = known_logits().to(torch.bfloat16)
    assert set(draw(SamplingConfig(temperature=1.0, top_p=0.7, seed=0), logits, 300)) == {17, 3}
