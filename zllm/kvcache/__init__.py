"""The prefix cache's backend-neutral parts: its settings, KV identities, near misses, retention, the SSD index,
recovery and writer thread, and `sequence_cache.SequencePrefixCache` (llama.cpp's sequences).

Imports nothing above it (no runtime, api, engine, prompt) and no engine library. The torch backend's cache over
per-layer tensors (radix tree, pooled buffers, tensor snapshots) lives in engine/torch/cache/.
"""

from zllm.diagnosis.near_miss import NearMiss
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.identity import model_key, request_namespace, template_hash, weights_identity

__all__ = ["CacheConfig", "NearMiss", "model_key", "request_namespace", "template_hash", "weights_identity"]
