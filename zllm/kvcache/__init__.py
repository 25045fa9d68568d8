"""The two-tier prefix cache: device tier (radix tree of shared prefixes), SSD tier (snapshots that survive
restarts), pooled working buffers, restore-vs-recompute estimate, near-miss log.

Imports nothing above it (no runtime, api, engine, prompt): torch and safetensors-format files only. The runtime
hands it token ids and per-layer KV tensors (`state.KVState`) and gets back restored working buffers.
"""

from zllm.kvcache.identity import model_key, request_namespace, template_hash, weights_identity
from zllm.kvcache.near_miss import NearMiss
from zllm.kvcache.prefix_cache import CacheConfig, Lease, PrefixCache
from zllm.kvcache.state import KVLayout, KVState

__all__ = ["CacheConfig", "KVLayout", "KVState", "Lease", "NearMiss", "PrefixCache", "model_key",
           "request_namespace", "template_hash", "weights_identity"]
