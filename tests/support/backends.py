"""One fixture, both engine backends: the same tiny random-weight model served on torch and on llama.cpp.

    @pytest.fixture(params=BACKENDS)
    def loaded(request):
        return load_tiny("qwen3", request.param)       # a LoadedModel for LocalEngineClient / EngineLoop

On llama.cpp the model is the same weights written as an F32 GGUF (tests/support/tiny_gguf.py) into a model
directory laid out as the store keeps GGUF models (model.gguf + config + tokenizer), cached per machine.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny_gguf import GGUF_RECIPE_VERSION, tiny_model_dir, tiny_torch_model, write_tiny_gguf
from tests.support.tiny_models import artifact_cache_dir

BACKENDS = ("torch", pytest.param("llamacpp", marks=pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")))


def tiny_gguf_model_dir(spec: str) -> Path:
    """A GGUF model directory for a tiny spec: its config and tokenizer files beside model.gguf (F32)."""
    final = artifact_cache_dir() / f"tiny-gguf-dir-{spec}-v{GGUF_RECIPE_VERSION}"
    if (final / "model.gguf").is_file():
        return final
    source = tiny_model_dir(spec)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec}-gguf-", dir=final.parent))
    try:
        for path in source.iterdir():
            if path.is_file() and not path.name.endswith(".safetensors"):
                shutil.copy2(path, work / path.name)
        model, tokenizer = tiny_torch_model(spec)
        write_tiny_gguf(model, tokenizer, work / "model.gguf", dtype="f32", name=f"tiny-{spec}")
        os.replace(work, final)
    except OSError:
        if not (final / "model.gguf").is_file():
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def load_tiny(spec: str, backend: str, *, context_length: int = 0, cache_budget_mb: int = 0):
    """The tiny model `spec` loaded for inference on `backend` (CPU, one thread, float32)."""
    from zllm.engine.select import load_for_backend

    directory = tiny_gguf_model_dir(spec) if backend == "llamacpp" else tiny_model_dir(spec)
    loaded = load_for_backend(directory, backend=backend, device="cpu", dtype="float32", threads=1,
                              context_length=context_length, cache_budget_mb=cache_budget_mb)
    return replace(loaded, threads=1)


class scripted_steps:
    """Context manager: make an engine client emit `token_ids` in order, one per engine step, on any backend.

    The seam-level twin of tiny_models.scripted_output (a forward hook on torch's lm_head): it wraps the
    client's `engine.step` (engine/contract.py), so the i-th step's logits (one row: requests run one at a
    time) become a one-hot-like row favouring `token_ids[i]`; after the script the model's own logits pass
    through. A prefill counts as one step (its prompt must fit one prefill chunk)."""

    def __init__(self, client, token_ids):
        self.engine = client.engine.engine
        self.token_ids = list(token_ids)
        self.calls = 0

    def _step(self, rows):
        outputs = self._original(rows)
        if self.calls >= len(self.token_ids):
            return outputs
        assert len(rows) == 1, "a scripted request runs alone"
        row = outputs[0]  # numpy (llama.cpp) or a torch tensor
        forced = np.full_like(row, -1e4) if isinstance(row, np.ndarray) else row.new_full(row.shape, -1e4)
        forced[..., self.token_ids[self.calls]] = 1e4
        self.calls += 1
        return [forced]

    def __enter__(self):
        self._original = self.engine.step
        self.engine.step = self._step
        return self

    def __exit__(self, *exc):
        self.engine.step = self._original


def tiny_qwen3_per_backend(context_length: int = 2048):
    """A generator for a module-scoped fixture: yields `get(backend)`, the tiny qwen3 model loaded once per
    backend, so every "daemon restart" of a test builds a new client (and cache stack) over the same weights.
    The fence vocabulary (llguidance's view of the tokenizer, ~10 s here) is built once per tokenizer too: a
    restart would rebuild the very same one, and such tests are about the cache.

        @pytest.fixture(scope="module")
        def served_models():
            yield from tiny_qwen3_per_backend()
    """
    from zllm.runtime.fence_vocab import FenceVocab

    models, vocabularies = {}, {}
    build = FenceVocab.build

    def build_once(tokenizer, **kwargs):
        key = (id(tokenizer), kwargs["vocab_size"], kwargs["stop_token_ids"])
        if key not in vocabularies:
            vocabularies[key] = build(tokenizer, **kwargs)
        return vocabularies[key]

    def get(backend: str):
        if backend not in models:
            models[backend] = replace(load_tiny("qwen3", backend), context_length=context_length)
        return models[backend]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FenceVocab, "build", build_once)
        yield get
    for loaded in models.values():
        loaded.close()
