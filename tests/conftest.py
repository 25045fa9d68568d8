"""Root test configuration: where test-time artifacts (tiny models, the pulled default model) are cached.

Building tiny random-weight models and importing the real SmolLM2 GGUF is done once per machine, not per
checkout, so CI on a fresh clone stays fast. Override with ZLLM_TEST_CACHE.
"""

import os
from pathlib import Path

import platformdirs
import pytest

os.environ.setdefault("ZLLM_TEST_CACHE", str(Path(platformdirs.user_cache_dir("zllm-tests"))))
# tests never talk to a real model hub
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory):
    """Factory: `tiny_gguf_path(spec, dtype="f32") -> Path`, a tiny random-weight model as a GGUF file
    (tests/support/tiny_gguf.py), each written once per session."""
    from tests.support.tiny_gguf import tiny_gguf_file

    directory = tmp_path_factory.mktemp("tiny-gguf")

    def get(spec: str, dtype: str = "f32") -> Path:
        return tiny_gguf_file(spec, directory, dtype=dtype)

    return get
