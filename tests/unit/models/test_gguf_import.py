"""GGUF import, for real: a tiny llama GGUF written with gguf.GGUFWriter from a known HF model."""

from __future__ import annotations

import hashlib

import pytest
import torch

from zllm.errors import PullError


@pytest.fixture
def original(tiny_original):
    return tiny_original


def test_import_reproduces_the_weights_exactly(store, tiny_gguf, original):
    from transformers import AutoModelForCausalLM

    model = store.pull(str(tiny_gguf))

    imported = AutoModelForCausalLM.from_pretrained(model.path).state_dict()
    expected = original[0].state_dict()
    assert imported.keys() == expected.keys()
    assert all(torch.equal(imported[k], expected[k]) for k in expected)  # q/k un-permuted, float32 exact


def test_import_keeps_tokenizer_and_chat_template(store, tiny_gguf, original, chatml):
    from transformers import AutoTokenizer

    model = store.pull(str(tiny_gguf))

    tokenizer = AutoTokenizer.from_pretrained(model.path)
    assert tokenizer.chat_template == chatml
    for text in ["The capital of France is Paris.", "def add(a, b):\n    return a + b\n"]:
        assert tokenizer.encode(text) == original[1].encode(text)
    assert tokenizer.eos_token == "<|im_end|>"


def test_import_manifest(store, tiny_gguf):
    model = store.pull(str(tiny_gguf))

    m = model.manifest
    assert model.name == "tiny-llama.F32"
    assert m.source == f"gguf:{tiny_gguf.resolve()}"
    assert (m.architecture, m.model_type, m.context_length, m.dtype) == ("LlamaForCausalLM", "llama", 256, "float32")
    assert m.origin["gguf_sha256"] == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert (m.origin["gguf_architecture"], m.origin["gguf_file_type"]) == ("llama", "F32")
    assert "model.safetensors" in m.files and not any(f.endswith(".gguf") for f in m.files)


def test_a_gguf_without_chat_template_is_refused(store, tmp_path, models_dir, tree_snapshot, gguf_writer):
    plain = gguf_writer(tmp_path / "plain.gguf", chat_template=None)
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="no chat template"):
        store.pull(str(plain))

    assert tree_snapshot(models_dir) == before
