"""The two-tier prefix cache: device tier (radix tree of shared prefixes), SSD tier (snapshots that survive
restarts), pooled working buffers, restore-vs-recompute estimate, near-miss log.

Imports nothing above it (no runtime, api, engine, prompt): torch and safetensors-format files only. The runtime
hands it token ids and per-layer KV tensors (`state.KVState`) and gets back restored working buffers.

Two caches live here: `PrefixCache` (torch tensors) and `sequence_cache.SequencePrefixCache` (llama.cpp
sequences). The names below that need torch are imported on first use, so the llama.cpp path (which imports
`config`, `identity`, `sequence_cache` only) never loads torch.
"""

from zllm.diagnosis.near_miss import NearMiss
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.identity import model_key, request_namespace, template_hash, weights_identity

__all__ = ["CacheConfig", "KVLayout", "KVState", "Lease", "NearMiss", "PrefixCache", "model_key",
           "request_namespace", "template_hash", "weights_identity"]

_TORCH_NAMES = {"Lease": "prefix_cache", "PrefixCache": "prefix_cache", "KVLayout": "state", "KVState": "state"}


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        import importlib

        return getattr(importlib.import_module(f"zllm.kvcache.{_TORCH_NAMES[name]}"), name)
    raise AttributeError(f"module 'zllm.kvcache' has no attribute {name!r}")
