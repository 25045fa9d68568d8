"""The sampling rule (engine/sampler.py) and the fence's mask on torch tensors, for the torch backend: logits on a
GPU are sampled and masked there, with no copy to the host per token (the chosen id stays on the device as a
`[1, 1]` tensor, ready to be the next decode input). Same functions, same rule as host_sampling.py."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from zllm.engine.host_sampling import MIN_EXPONENTIAL
from zllm.engine.sampler import register_kernels

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def new_generator(seed: int, device: Any) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax().view(1, 1)


def sample(logits: torch.Tensor, config: Any, generator: torch.Generator) -> torch.Tensor:
    scaled = logits.float() / config.temperature  # [vocab]
    candidate_ids = None  # None: candidates are the whole vocabulary, in id order
    if 0 < config.top_k < scaled.shape[-1]:
        scaled, candidate_ids = scaled.topk(config.top_k)  # [k], sorted descending
    elif config.top_p < 1.0:
        scaled, candidate_ids = scaled.sort(descending=True)  # [vocab]
    probs = torch.softmax(scaled, dim=-1)
    if config.top_p < 1.0:
        probs = top_p_mask(probs, config.top_p)
    choice = (probs / _exponentials(probs, generator)).argmax()
    return (choice if candidate_ids is None else candidate_ids[choice]).view(1, 1)


def sampling_probs(logits: torch.Tensor, config: Any) -> torch.Tensor:
    scaled = logits.float() / config.temperature  # [vocab]
    if 0 < config.top_k < scaled.shape[-1]:
        values, ids = scaled.topk(config.top_k)  # [k], descending, as `sample` takes them
    elif config.top_p < 1.0:
        values, ids = scaled.sort(descending=True)
    else:
        return torch.softmax(scaled, dim=-1)
    probs = torch.softmax(values, dim=-1)
    if config.top_p < 1.0:
        probs = top_p_mask(probs, config.top_p)  # the same nucleus rule as `sample`
        probs = probs / probs.sum()
    return torch.zeros_like(scaled).scatter_(0, ids, probs)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return (probs / _exponentials(probs, generator)).argmax().view(1, 1)


def uniforms(count: int, generator: torch.Generator, like: torch.Tensor) -> list[float]:
    return torch.rand(count, generator=generator, device=like.device).tolist()


def top_p_mask(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    return sorted_probs.masked_fill(mass_before >= top_p, 0.0)


def _exponentials(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # E ~ Exp(1) as -log(U): the same draw, several times cheaper than exponential_() on a CPU, where
    # exponential_() over a large vocabulary made sampling cost as much as a tiny model's forward pass
    return torch.empty_like(like).uniform_(generator=generator).log_().neg_().clamp_min_(MIN_EXPONENTIAL)


def mask_logits(logits: torch.Tensor, words: np.ndarray, covered: int) -> None:
    """`logits[..., :covered]` = -inf where the bit of `words` (llguidance's layout, host int32) is clear,
    by shifts on the logits' device."""
    device = logits.device
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS.setdefault(device, torch.arange(32, dtype=torch.int32, device=device))
    on_device = torch.from_numpy(np.ascontiguousarray(words)).to(device, non_blocking=True)  # [..., mask_words]
    bits = (on_device.unsqueeze(-1) >> shifts) & 1  # [..., mask_words, 32]
    allowed = bits.flatten(-2)[..., :covered]  # [..., covered]
    logits[..., :covered].masked_fill_(allowed == 0, float("-inf"))


def host_view(logits: torch.Tensor) -> np.ndarray | None:
    """The logits as a numpy array over the same memory when they are a contiguous float32 CPU tensor (the
    fence's numpy mask is faster than torch ops there), else None."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        return logits.numpy()
    return None


register_kernels(torch.Tensor, sys.modules[__name__])
