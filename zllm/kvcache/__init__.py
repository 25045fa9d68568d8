"""The one prefix cache (prefix_cache.py) over a per-backend KV interface (kv_interface.py), its entry graph, settings,
KV identities, retention, the SSD index, recovery and writer thread, and llama.cpp's state snapshot store.

Imports nothing above it (no runtime, api, engine, prompt) and no engine library. Each backend's KV (torch: pooled
buffers over a span tree of tensors, tensor snapshots; llama.cpp: its sequences) lives in its engine package.
"""

from zllm.diagnosis.near_miss import NearMiss
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.identity import model_key, request_namespace, template_hash, weights_identity

__all__ = ["CacheConfig", "NearMiss", "model_key", "request_namespace", "template_hash", "weights_identity"]
