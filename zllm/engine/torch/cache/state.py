"""KV state as the prefix cache sees it: per layer, a few model-owned tensors that can be sliced by token range.

    KVState = ((k0, v0), (k1, v1), ...)      # one tuple per layer
    k: [batch=1, kv_heads, seq, head_dim]     # the token axis is always -2 (SEQ_AXIS)

The cache never assumes what a layer's tensors mean (K/V heads today; MLA latents would be one tensor of
shape [1, seq, rank] — same axis rule), only that every tensor of every layer has the same token count on
axis -2. `KVLayout` is the per-token part of each shape plus the dtype: what a saved snapshot must match.

Bytes are always counted from the tensors' storages, deduplicated, so views never count twice and a view
that keeps a large storage alive counts the whole storage (a span kept at rest is a clone, or a view of a working set
kept whole because the span fills most of it: backing.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from zllm.token_prefix import common_prefix_length  # noqa: F401 (re-exported)

SEQ_AXIS = -2
LayerKV = tuple[torch.Tensor, ...]
KVState = tuple[LayerKV, ...]

_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
DTYPES_BY_NAME = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """safetensors' dtype code ("F32", "BF16", "F16"); the only dtypes the cache keeps."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"the prefix cache does not handle KV dtype {dtype}")
    return _DTYPE_NAMES[dtype]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of one layer: its shape with the token axis removed, and its dtype."""

    row_shape: tuple[int, ...]  # e.g. (1, kv_heads, head_dim) for k: [1, kv_heads, seq, head_dim]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        assert len(self.row_shape) >= 1 and all(d > 0 for d in self.row_shape), self.row_shape
        dtype_name(self.dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes per token of this tensor."""
        n = self.dtype.itemsize
        for d in self.row_shape:
            n *= d
        return n

    def full_shape(self, tokens: int) -> tuple[int, ...]:
        """The in-memory shape for `tokens` tokens: the token axis inserted at -2."""
        return (*self.row_shape[:-1], tokens, self.row_shape[-1])


@dataclass(frozen=True)
class KVLayout:
    """Per layer, the specs of its tensors. Two states are interchangeable only under the same layout."""

    layers: tuple[tuple[TensorSpec, ...], ...]

    def __post_init__(self) -> None:
        assert self.layers and all(self.layers), "a layout has at least one layer with at least one tensor"

    @classmethod
    def of(cls, state: KVState) -> KVLayout:
        return cls(tuple(tuple(_spec_of(t) for t in layer) for layer in state))

    @property
    def bytes_per_token(self) -> int:
        return sum(spec.row_bytes for layer in self.layers for spec in layer)

    @property
    def key(self) -> str:
        """A short stable id of the layout (part of SSD validation and of the cost-estimate key)."""
        text = ";".join(",".join(f"{s.row_shape}:{dtype_name(s.dtype)}" for s in layer) for layer in self.layers)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def check(self, state: KVState) -> int:
        """The token count of `state`; raises ValueError if it does not fit this layout."""
        if len(state) != len(self.layers):
            raise ValueError(f"state has {len(state)} layers, layout {len(self.layers)}")
        lengths = set()
        for layer, specs in zip(state, self.layers):
            if len(layer) != len(specs):
                raise ValueError("a layer has the wrong number of tensors")
            for tensor, spec in zip(layer, specs):
                if _spec_of(tensor) != spec:
                    raise ValueError(f"tensor {tuple(tensor.shape)} {tensor.dtype} does not match {spec}")
                lengths.add(tensor.shape[SEQ_AXIS])
        if len(lengths) != 1:
            raise ValueError(f"layers disagree on the token count: {sorted(lengths)}")
        return lengths.pop()

    def empty(self, tokens: int, device: torch.device | str = "cpu") -> KVState:
        return tuple(tuple(torch.empty(s.full_shape(tokens), dtype=s.dtype, device=device) for s in layer)
                     for layer in self.layers)


def _spec_of(tensor: torch.Tensor) -> TensorSpec:
    shape = tuple(tensor.shape)
    return TensorSpec(row_shape=shape[:-2] + shape[-1:], dtype=tensor.dtype)


def seq_len(state: KVState) -> int:
    return state[0][0].shape[SEQ_AXIS]


def slice_state(state: KVState, start: int, stop: int) -> KVState:
    """Views of tokens [start, stop) — no copy; clone before keeping them at rest."""
    return tuple(tuple(t[..., start:stop, :] for t in layer) for layer in state)


def clone_state(state: KVState) -> KVState:
    """Contiguous, owned copies (a kept span must not pin the working cache's larger storage)."""
    return tuple(tuple(t.clone(memory_format=torch.contiguous_format) for t in layer) for layer in state)


def copy_into(dest: KVState, start: int, source: KVState) -> None:
    """dest[..., start:start+len(source), :] = source, layer by layer."""
    n = seq_len(source)
    for dest_layer, source_layer in zip(dest, source):
        for d, s in zip(dest_layer, source_layer):
            d[..., start:start + n, :].copy_(s)


def buffers_key(state: KVState) -> int:
    """Which working set a state lives in: its first tensor's storage (every tensor of a set grows together)."""
    return state[0][0].untyped_storage().data_ptr()


def whole_buffers(state: KVState, layout: KVLayout) -> KVState:
    """The whole working set `state` is the filled part of (kv_layers.py: `buffer[..., :length, :]`, each buffer
    one contiguous allocation of `capacity` tokens): views of every token its storages hold."""
    def whole(tensor: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
        shape = spec.full_shape(tensor.untyped_storage().nbytes() // spec.row_bytes)
        return tensor.as_strided(shape, torch.empty(shape, device="meta").stride(), 0)

    return tuple(tuple(whole(t, spec) for t, spec in zip(layer, specs)) for layer, specs in zip(state, layout.layers))


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Real bytes held by `tensors`: each distinct storage once, whole (a view pins its entire storage)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def state_tensors(state: KVState) -> list[torch.Tensor]:
    return [t for layer in state for t in layer]
