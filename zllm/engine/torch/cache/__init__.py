"""The torch backend's side of the prefix cache (kv.py: kvcache/kv_interface.py's KV interface): pooled working
buffers, a span tree of shared prefixes over per-layer KV tensors (owned, or views of a kept working set the next
turn runs in: backing.py), the SSD tier of tensor snapshots. The cache
itself and the backend-neutral parts (entry graph, settings, identities, retention, the SSD index and recovery, the
writer thread) are zllm/kvcache's.
"""
