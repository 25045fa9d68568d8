"""The torch backend's prefix cache: device tier (radix tree of shared prefixes over per-layer KV tensors),
SSD tier (tensor snapshots that survive restarts), pooled working buffers. The backend-neutral parts (settings,
identities, retention, the SSD index and recovery, the writer thread) are zllm/kvcache's.
"""
