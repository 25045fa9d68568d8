"""Working KV caches over preallocated buffers: a `DynamicCache` whose layers append in place.

transformers' `DynamicLayer` grows by `torch.cat` on every update, so each decode step copies the whole
layer, a cost that grows with the context and soon dominates a CPU decode step. `PreallocatedLayer` writes
into a caller-provided buffer instead and exposes views of the filled part:

    key_buffer: [1, kv_heads, capacity, head_dim]      keys = key_buffer[..., :length, :]

so a restored prefix is just "buffer already holds `length` tokens", decode growth was reserved up front, and
the buffers can be pooled across requests (the prefix cache owns the pool). When a request outgrows its
capacity the layer reallocates with doubling (amortized O(1) per token), like a vector.

Only full-attention `DynamicLayer`s are replaced; models with sliding-window, linear-attention or shared KV
layers keep transformers' own layers (and `supports_working_buffers` tells the runtime to skip the prefix cache).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer

LayerBuffers = tuple[torch.Tensor, torch.Tensor]  # (key_buffer, value_buffer), each [1, kv_heads, capacity, head_dim]


class PreallocatedLayer(DynamicLayer):
    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int = 0):
        super().__init__()
        assert key_buffer.shape[-2] == value_buffer.shape[-2] >= length >= 0
        self.key_buffer, self.value_buffer = key_buffer, value_buffer
        self.length = length
        self.device = key_buffer.device
        self.is_initialized = True  # the buffers fix dtype and device; nothing to infer from the first update
        self._expose()

    @property
    def capacity(self) -> int:
        return self.key_buffer.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]  # key_states: [1, kv_heads, n, head_dim]
        if self.length + n > self.capacity:
            self._grow(self.length + n)
        self.key_buffer[..., self.length:self.length + n, :].copy_(key_states)
        self.value_buffer[..., self.length:self.length + n, :].copy_(value_states)
        self.length += n
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        assert tokens_to_remove <= 0, "crop takes a negative count, as DynamicLayer.crop does"
        self.length = max(0, self.length + tokens_to_remove)
        self._expose()

    def reset(self) -> None:
        self.length = 0
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("working caches are batch 1")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("working caches are batch 1")

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.capacity)
        # each from its own shape: keys and values differ in width for latent attention (DeepSeek's MLA)
        self.key_buffer = _regrown(self.key_buffer, capacity, self.length)
        self.value_buffer = _regrown(self.value_buffer, capacity, self.length)

    def _expose(self) -> None:
        self.keys = self.key_buffer[..., :self.length, :]
        self.values = self.value_buffer[..., :self.length, :]


def _regrown(buffer: torch.Tensor, capacity: int, length: int) -> torch.Tensor:
    grown = buffer.new_empty((*buffer.shape[:-2], capacity, buffer.shape[-1]))
    grown[..., :length, :].copy_(buffer[..., :length, :])
    return grown


def supports_working_buffers(config: PreTrainedConfig) -> bool:
    """True when every cache layer of this model is a plain full-attention `DynamicLayer`."""
    probe = DynamicCache(config=config)
    return bool(probe.layers) and all(type(layer) is DynamicLayer for layer in probe.layers)


def working_cache(config: PreTrainedConfig, buffers: tuple[LayerBuffers, ...], length: int) -> DynamicCache:
    """A cache whose layers append into `buffers`, the first `length` tokens of which are already filled."""
    cache = DynamicCache(config=config)
    assert len(cache.layers) == len(buffers), "one (key, value) buffer pair per layer"
    cache.layers = [PreallocatedLayer(k, v, length) for k, v in buffers]
    return cache


def cache_state(cache: DynamicCache) -> tuple[LayerBuffers, ...]:
    """The filled part of each layer: views `[1, kv_heads, length, head_dim]` (valid until the next update)."""
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def cache_buffers(cache: DynamicCache) -> tuple[LayerBuffers, ...] | None:
    """The buffers the layers ended with (larger than the originals if a request outgrew them)."""
    if not all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
        return None
    return tuple((layer.key_buffer, layer.value_buffer) for layer in cache.layers)


def croppable(cache: DynamicCache) -> bool:
    """Whether `crop_to` can shorten every layer (full attention only: a sliding-window or linear-attention
    layer cannot take tokens back)."""
    return bool(cache.layers) and all(type(layer) in (DynamicLayer, PreallocatedLayer) for layer in cache.layers)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Forget every token past the first `length` (rejected speculative drafts): the cache then holds exactly
    what it held after `length` tokens were fed, and the next forward continues at position `length`."""
    held = cache.get_seq_length()
    assert 0 <= length <= held, f"cannot crop a {held}-token cache to {length} tokens"
    if length < held:
        cache.crop(length - held)  # a negative count: tokens to remove
