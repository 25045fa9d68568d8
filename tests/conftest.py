"""Root test configuration: where test-time artifacts (tiny models, the pulled default model) are cached.

Building tiny random-weight models and importing the real SmolLM2 GGUF is done once per machine, not per
checkout, so CI on a fresh clone stays fast. Override with ZLLM_TEST_CACHE.
"""

import os
from pathlib import Path

import platformdirs

os.environ.setdefault("ZLLM_TEST_CACHE", str(Path(platformdirs.user_cache_dir("zllm-tests"))))
# tests never talk to a real model hub
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
