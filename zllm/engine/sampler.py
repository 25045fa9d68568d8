"""Pick the next token from one row of logits: greedy, or temperature / top-k / top-p sampling.

Logits come as the engine hands them (engine/contract.py): numpy arrays in host memory (llama.cpp) or torch
tensors on the model's device (torch). The rule is written once, as numpy (engine/host_sampling.py), and once
more for torch tensors (engine/torch/sampling.py) so that a GPU's logits are sampled where they are, without
a copy to the host per token. A backend whose logits are not numpy arrays registers its kernels
(`register_kernels`, as its package is imported): this rule never imports an engine library.

Vectorized over the vocabulary (no Python loops over it): sampling uses the exponential-race form of the
Gumbel-max trick (`argmax(p / E)`, `E ~ Exp(1)`), which draws from `p` without normalizing it and without a
multinomial. A per-request random stream (numpy's PCG64, or a `torch.Generator` on the logits' device) makes
a seeded request reproducible no matter what other requests run in between. Greedy picks are identical on
both (the first maximal id); seeded draws are reproducible per backend, but the two streams differ, so one
seed draws different tokens on llama.cpp and on torch (each from the same distribution).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from zllm.engine import host_sampling


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        # user input is validated in canonical.SamplingParams; these are "cannot happen" checks
        assert self.temperature >= 0.0 and 0.0 < self.top_p <= 1.0 and self.top_k >= 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


# array type → the sampling kernels for logits of that type, registered by the backend that returns them
_DEVICE_KERNELS: dict[type, ModuleType] = {}


def register_kernels(array_type: type, kernels: ModuleType) -> None:
    """`kernels` (host_sampling's functions, plus `new_generator`, `mask_logits` and `host_view`) sample and mask
    logits of `array_type`: a backend's own arrays, on its device."""
    _DEVICE_KERNELS[array_type] = kernels


def kernels_for(array: Any) -> ModuleType:
    """The sampling kernels for `array`'s kind: numpy's, or those its backend registered."""
    if isinstance(array, np.ndarray):
        return host_sampling
    for kind in type(array).__mro__:
        if kind in _DEVICE_KERNELS:
            return _DEVICE_KERNELS[kind]
    raise TypeError(f"no sampling kernels for {type(array).__name__} logits (their backend registers them)")


def device_kernels() -> ModuleType:
    """The kernels of the backend whose logits live on a device (a Sampler given a device samples with them)."""
    assert _DEVICE_KERNELS, "a backend with device logits registers its kernels as its package is imported"
    return next(iter(_DEVICE_KERNELS.values()))


class Sampler:
    """One request's sampler: its settings and its own random stream.

    `device`: where the engine's logits live — a torch device (or its name) for torch tensors, None for numpy
    arrays in host memory (engine.device says which)."""

    def __init__(self, config: SamplingConfig, device: Any = "cpu"):
        self.config = config
        self.generator: Any = None  # np.random.Generator or torch.Generator; None when greedy
        if not config.greedy:
            seed = config.seed if config.seed is not None else secrets.randbits(63)
            if device is None:
                self.generator = np.random.default_rng(seed)
            else:
                self.generator = device_kernels().new_generator(seed, device)

    def __call__(self, logits: Any) -> Any:
        """logits: [vocab] → the chosen token id as a [1, 1] integer array of the same kind (and device)."""
        kernels = kernels_for(logits)
        if self.generator is None:
            return kernels.greedy(logits)
        return kernels.sample(logits, self.config, self.generator)
