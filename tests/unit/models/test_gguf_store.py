"""GGUF files stay GGUF: stored as `model.gguf` byte for byte, with the config and tokenizer read from it.

Real tiny GGUFs written with gguf.GGUFWriter (conftest.write_gguf), real links and copies on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from zllm.errors import PullError
from zllm.models import MANIFEST_FILE
from zllm.models.weights import GGUF_FILE, gguf_weights, weights_format

LAYOUT = {GGUF_FILE, "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", MANIFEST_FILE}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_gguf_is_stored_as_it_is_next_to_its_config_and_tokenizer(store, tiny_gguf):
    model = store.pull(str(tiny_gguf))

    assert {p.name for p in model.path.iterdir()} == LAYOUT  # no safetensors: nothing was dequantized
    stored = model.path / GGUF_FILE
    assert stored.read_bytes() == tiny_gguf.read_bytes()
    assert os.stat(stored).st_ino == os.stat(tiny_gguf).st_ino  # same file system: a hard link, no copy
    assert gguf_weights(model.path) == stored.resolve() and weights_format(model.path) == "gguf"
    config = json.loads((model.path / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["max_position_embeddings"]) == (
        ["LlamaForCausalLM"],
        "llama",
        256,
    )


def test_the_tokenizer_and_chat_template_survive(store, tiny_gguf, tiny_original, chatml):
    from transformers import AutoTokenizer

    model = store.pull(str(tiny_gguf))

    tokenizer = AutoTokenizer.from_pretrained(model.path)
    assert tokenizer.chat_template == chatml
    for text in ["The capital of France is Paris.", "def add(a, b):\n    return a + b\n"]:
        assert tokenizer.encode(text) == tiny_original[1].encode(text)
    assert tokenizer.eos_token == "<|im_end|>"


def test_the_manifest_says_gguf_and_its_quantization(store, q8_gguf):
    model = store.pull(str(q8_gguf))

    m = model.manifest
    assert model.name == "tiny-llama.Q8_0"
    assert m.source == f"gguf:{q8_gguf.resolve()}"
    assert (m.weights_format, m.quantization, m.dtype) == ("gguf", "Q8_0", "Q8_0")
    assert (m.architecture, m.model_type, m.context_length) == ("LlamaForCausalLM", "llama", 256)
    assert m.files[GGUF_FILE] == m.origin["gguf_sha256"] == _sha256(q8_gguf)
    assert set(m.files) == LAYOUT - {MANIFEST_FILE}
    assert m.origin["gguf_link"] == "hardlink" and m.origin["gguf_file_type"] == "Q8_0"
    on_disk = json.loads((model.path / MANIFEST_FILE).read_text())
    assert (on_disk["weights_format"], on_disk["quantization"]) == ("gguf", "Q8_0")


def test_the_gguf_is_hashed_once(store, tiny_gguf, monkeypatch):
    import zllm.models.store as store_module
    from zllm.models.sources import gguf_import

    hashed: list[str] = []
    for module in (gguf_import, store_module):
        real = module.sha256_file

        def spy(path, on_bytes=None, real=real):
            hashed.append(Path(path).name)
            return real(path, on_bytes)

        monkeypatch.setattr(module, "sha256_file", spy)

    store.pull(str(tiny_gguf))

    assert hashed.count(tiny_gguf.name) + hashed.count(GGUF_FILE) == 1


def test_a_gguf_on_another_file_system_is_copied(store, gguf_writer):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(store.models_dir).st_dev:
        pytest.skip("needs a second file system (/dev/shm)")
    elsewhere = gguf_writer(shm / f"zllm-test-{os.getpid()}.gguf")
    try:
        model = store.pull(str(elsewhere), name="copied")
        stored = model.path / GGUF_FILE
        assert model.manifest.origin["gguf_link"] == "copy" and not stored.is_symlink()
        assert stored.read_bytes() == elsewhere.read_bytes()
    finally:
        elsewhere.unlink()
    assert (model.path / GGUF_FILE).is_file()  # the store owns its copy


def test_a_stored_gguf_is_removed_without_touching_the_original(store, tiny_gguf):
    before = tiny_gguf.read_bytes()
    store.pull(str(tiny_gguf), name="linked")

    store.remove("linked")

    assert tiny_gguf.read_bytes() == before


# --- refused at pull ---------------------------------------------------------------------------------


def _refused(store, models_dir, tree_snapshot, source: str, match: str, **kwargs) -> PullError:
    before = tree_snapshot(models_dir)
    with pytest.raises(PullError, match=match) as caught:
        store.pull(source, **kwargs)
    assert tree_snapshot(models_dir) == before  # nothing left in the store, not even in staging
    assert caught.value.hint
    return caught.value


def test_a_gguf_without_chat_template_is_refused(store, tmp_path, models_dir, tree_snapshot, gguf_writer):
    plain = gguf_writer(tmp_path / "plain.gguf", chat_template=None)
    _refused(store, models_dir, tree_snapshot, str(plain), "no chat template")


def test_a_file_without_the_gguf_magic_is_refused(store, tmp_path, models_dir, tree_snapshot, tiny_gguf):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"<!DOCTYPE html>" + tiny_gguf.read_bytes()[4:])
    _refused(store, models_dir, tree_snapshot, str(fake), "is not a GGUF file")


@pytest.mark.parametrize("keep", [0.001, 0.01, 0.5, 0.999, -1])
def test_a_truncated_gguf_is_refused(store, tmp_path, models_dir, tree_snapshot, tiny_gguf, keep):
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)] if keep > 0 else data[:-1])
    error = _refused(store, models_dir, tree_snapshot, str(cut), "truncated")
    assert "again" in error.hint


def test_truncation_is_caught_by_the_declared_tensor_extents(tmp_path, tiny_gguf):
    """The header check does not rely on gguf raising: data_end is where the last tensor ends."""
    from zllm.models.gguf_header import read_gguf_header

    header = read_gguf_header(tiny_gguf)
    assert header.data_end <= header.size_bytes == tiny_gguf.stat().st_size
    assert header.data_end > header.size_bytes - 64  # at most the alignment padding follows the last tensor


def test_a_made_up_architecture_is_refused(store, tmp_path, models_dir, tree_snapshot, gguf_writer):
    odd = gguf_writer(tmp_path / "odd.gguf", architecture="zllm-made-up")
    error = _refused(store, models_dir, tree_snapshot, str(odd), "`zllm-made-up`, which llama.cpp does not know")
    assert "safetensors" in error.hint


def test_an_architecture_transformers_cannot_tokenize_is_refused(
    store, tmp_path, models_dir, tree_snapshot, gguf_writer
):
    grok = gguf_writer(tmp_path / "grok.gguf", architecture="grok")  # llama.cpp knows it, transformers does not
    error = _refused(store, models_dir, tree_snapshot, str(grok), "transformers cannot read the tokenizer")
    assert "llama" in error.hint


def test_a_split_gguf_is_refused(store, tmp_path, models_dir, tree_snapshot, gguf_writer):
    part = gguf_writer(tmp_path / "big-00001-of-00003.gguf", split_count=3)
    _refused(store, models_dir, tree_snapshot, str(part), "split into 3 files; split GGUFs are not supported yet")


def test_file_applies_only_to_repos(store, tiny_gguf):
    with pytest.raises(PullError, match="--file names a GGUF in a hub repo or an LM Studio folder"):
        store.pull(str(tiny_gguf), file="other.gguf")
