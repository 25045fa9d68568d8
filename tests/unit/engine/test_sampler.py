"""Sampler: greedy is argmax, seeds reproduce, top-k / top-p cut the candidates, temperature reshapes — on both
kinds of logits the engine seam hands out: torch tensors (torch backend) and numpy arrays (llama.cpp)."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from zllm.engine import host_sampling
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.engine.torch import sampling as torch_sampling

VOCAB = 151936
CONFIGS = [SamplingConfig(0.7), SamplingConfig(1.0, top_k=40), SamplingConfig(1.3, top_p=0.9),
           SamplingConfig(0.8, top_k=50, top_p=0.8)]


@pytest.fixture(params=["torch", "numpy"])
def kind(request) -> str:
    return request.param


def as_kind(logits: torch.Tensor, kind: str):
    """The logits as the engine of `kind` would hand them (llama.cpp: float32 numpy)."""
    return logits if kind == "torch" else logits.float().numpy().copy()


def sampler_for(config: SamplingConfig, kind: str) -> Sampler:
    return Sampler(config, "cpu" if kind == "torch" else None)


def draw(config: SamplingConfig, logits: torch.Tensor, n: int, kind: str = "torch") -> list[int]:
    sampler, logits = sampler_for(config, kind), as_kind(logits, kind)
    return [int(sampler(logits).item()) for _ in range(n)]


def frequencies(samples: list[int]) -> dict[int, float]:
    return {token: count / len(samples) for token, count in Counter(samples).items()}


@pytest.mark.parametrize("config", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7, seed=1)])
def test_returns_a_1x1_integer_array_of_the_logits_kind(config, kind) -> None:
    token = sampler_for(config, kind)(as_kind(torch.randn(VOCAB), kind))
    assert token.shape == (1, 1) and 0 <= int(token.item()) < VOCAB
    if kind == "torch":
        assert token.dtype == torch.long
    else:
        assert isinstance(token, np.ndarray) and token.dtype == np.int64


def test_temperature_zero_is_argmax(kind) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(VOCAB, generator=gen)
        assert draw(SamplingConfig(temperature=0.0), logits, 1, kind) == [int(logits.argmax())]


def test_greedy_breaks_ties_alike_on_both_kinds() -> None:
    """Same logits, same greedy token on both backends' kinds: argmax takes the first maximal id."""
    logits = torch.zeros(VOCAB)
    logits[[900, 17, 50_000]] = 3.0
    assert draw(SamplingConfig(0.0), logits, 1, "torch") == draw(SamplingConfig(0.0), logits, 1, "numpy") == [17]


@pytest.mark.parametrize("config", CONFIGS)
def test_both_kinds_sample_from_the_same_distribution(config) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    numpy_probs = host_sampling.sampling_probs(logits.numpy().copy(), config)
    torch_probs = torch_sampling.sampling_probs(logits, config).numpy()
    # float32 sums in another order: the nucleus's last token may fall in on one side only
    both = (numpy_probs > 0) & (torch_probs > 0)
    assert np.count_nonzero((numpy_probs > 0) != (torch_probs > 0)) <= 1
    assert np.allclose(numpy_probs[both], torch_probs[both], rtol=1e-3, atol=1e-8)
    assert numpy_probs.sum() == pytest.approx(1.0, abs=1e-5)


def test_top_k_one_is_greedy_even_at_high_temperature(kind) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    assert set(draw(SamplingConfig(temperature=5.0, top_k=1, seed=3), logits, 50, kind)) == {int(logits.argmax())}


def test_same_seed_same_tokens_and_different_seed_differs(kind) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))  # flat-ish: many candidates
    a = draw(SamplingConfig(temperature=1.0, seed=42), logits, 30, kind)
    b = draw(SamplingConfig(temperature=1.0, seed=42), logits, 30, kind)
    c = draw(SamplingConfig(temperature=1.0, seed=43), logits, 30, kind)
    assert a == b
    assert a != c


def test_unseeded_samplers_are_not_all_identical(kind) -> None:
    logits = torch.zeros(VOCAB)
    config = SamplingConfig(temperature=1.0)
    assert draw(config, logits, 10, kind) != draw(config, logits, 10, kind)


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


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(kind) -> None:
    samples = draw(SamplingConfig(temperature=1.0, top_p=0.7, seed=0), known_logits(), 3000, kind)
    freq = frequencies(samples)
    assert set(freq) == {17, 3}  # 0.5 < 0.7, then 0.5 + 0.3 reaches it: 900 and 42 are cut
    assert freq[17] == pytest.approx(0.5 / 0.8, abs=0.04)  # renormalized inside the kept set


def test_top_p_always_keeps_the_most_likely_token(kind) -> None:
    assert set(draw(SamplingConfig(temperature=1.0, top_p=0.01, seed=0), known_logits(), 200, kind)) == {17}


def test_top_p_one_keeps_everything(kind) -> None:
    assert set(draw(SamplingConfig(temperature=1.0, top_p=1.0, seed=0), known_logits(), 4000, kind)) == set(PROBS)


def test_top_k_keeps_the_k_most_likely(kind) -> None:
    freq = frequencies(draw(SamplingConfig(temperature=1.0, top_k=2, seed=0), known_logits(), 3000, kind))
    assert set(freq) == {17, 3}
    assert freq[17] == pytest.approx(0.5 / 0.8, abs=0.04)


def test_top_k_and_top_p_combine(kind) -> None:
    # top_k=3 keeps 0.5/0.3/0.15 (renormalized 0.526/0.316/0.158); top_p=0.6 then keeps the first two
    samples = draw(SamplingConfig(temperature=1.0, top_k=3, top_p=0.6, seed=0), known_logits(), 500, kind)
    assert set(samples) == {17, 3}


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_the_distribution(temperature: float, kind) -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    expected = torch.softmax(logits / temperature, dim=-1)
    freq = frequencies(draw(SamplingConfig(temperature=temperature, seed=11), logits, 4000, kind))
    for token in range(4):
        assert freq.get(token, 0.0) == pytest.approx(float(expected[token]), abs=0.03)


def test_tiny_temperature_is_practically_greedy(kind) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(9))
    assert set(draw(SamplingConfig(temperature=1e-4, seed=1), logits, 20, kind)) == {int(logits.argmax())}


def test_masked_tokens_are_never_sampled_even_with_infinite_logits_elsewhere(kind) -> None:
    logits = torch.full((100,), float("-inf"))
    logits[[5, 6]] = 0.0
    assert set(draw(SamplingConfig(temperature=1.0, seed=0), logits, 300, kind)) == {5, 6}


def test_half_precision_logits_are_sampled_in_float32() -> None:
    logits = known_logits().to(torch.bfloat16)
    assert set(draw(SamplingConfig(temperature=1.0, top_p=0.7, seed=0), logits, 300)) == {17, 3}
