"""The files of a stored model directory that more than the model store reads: the loaders (engine/) find the
GGUF by its name and the KV cache (kvcache/identity.py) keys on the manifest's sha256. Neither may import
zllm.models (tests/unit/test_layering.py), so the names live here, below all three.
"""

from __future__ import annotations

# written last, once the model is whole (models/manifest.py); a directory without one is not a model
MANIFEST_FILE = "zllm-manifest.json"
# a GGUF model's weights, under a fixed name whatever the pulled file was called (models/weights.py)
GGUF_FILE = "model.gguf"
