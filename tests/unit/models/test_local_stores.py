"""`ollama:` and `lmstudio:` pulls, from real directory trees laid out like those apps' stores."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from zllm.errors import PullError
from zllm.models.weights import GGUF_FILE, gguf_weights


def _blob(blobs: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest.replace(":", "-")).write_bytes(data)
    return digest


def add_ollama_model(root: Path, name: str, tag: str, gguf: bytes, *, namespace: str = "library") -> Path:
    """What `ollama pull` leaves: a manifest with the GGUF layer plus template/params layers, and blobs."""
    blobs = root / "blobs"
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": _blob(blobs, gguf), "size": len(gguf)},
        {"mediaType": "application/vnd.ollama.image.template", "digest": _blob(blobs, b"{{ .Prompt }}"), "size": 13},
        {"mediaType": "application/vnd.ollama.image.params", "digest": _blob(blobs, b'{"stop":[]}'), "size": 11},
    ]
    config = b'{"model_format":"gguf"}'
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": _blob(blobs, config)},
        "layers": layers,
    }
    path = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


@pytest.fixture
def ollama(tmp_path, monkeypatch, q8_gguf):
    root = tmp_path / "ollama-models"
    add_ollama_model(root, "tiny", "q8", q8_gguf.read_bytes())
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def test_pull_from_ollama_links_the_blob(store, ollama, q8_gguf):
    model = store.pull("ollama:tiny:q8")

    m = model.manifest
    digest = hashlib.sha256(q8_gguf.read_bytes()).hexdigest()
    blob = ollama / "blobs" / f"sha256-{digest}"
    assert (model.name, m.source) == ("tiny-q8", "ollama:tiny:q8")
    assert os.stat(model.path / GGUF_FILE).st_ino == os.stat(blob).st_ino  # linked, not copied
    assert (m.weights_format, m.quantization, m.architecture) == ("gguf", "Q8_0", "LlamaForCausalLM")
    assert m.files[GGUF_FILE] == digest and m.origin["gguf_link"] == "hardlink"
    assert m.origin["ollama_manifest"].endswith("registry.ollama.ai/library/tiny/q8")


def test_ollama_names_default_to_latest_and_may_have_a_namespace(store, ollama, tiny_gguf):
    add_ollama_model(ollama, "tiny", "latest", tiny_gguf.read_bytes())
    add_ollama_model(ollama, "tiny", "latest", tiny_gguf.read_bytes(), namespace="someone")

    assert store.pull("ollama:tiny").name == "tiny"
    other = store.pull("ollama:someone/tiny")
    assert (other.name, other.manifest.source) == ("someone/tiny", "ollama:someone/tiny:latest")


def test_an_ollama_manifest_pointing_at_a_missing_blob_is_refused(store, ollama, q8_gguf, models_dir, tree_snapshot):
    (ollama / "blobs" / f"sha256-{hashlib.sha256(q8_gguf.read_bytes()).hexdigest()}").unlink()
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="weights of the Ollama model `tiny:q8` are missing") as caught:
        store.pull("ollama:tiny:q8")

    assert "ollama pull tiny:q8" in caught.value.hint
    assert tree_snapshot(models_dir) == before


def test_a_truncated_ollama_blob_is_refused(store, ollama, q8_gguf, models_dir, tree_snapshot):
    blob = ollama / "blobs" / f"sha256-{hashlib.sha256(q8_gguf.read_bytes()).hexdigest()}"
    blob.write_bytes(q8_gguf.read_bytes()[:-100])
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="manifest says"):
        store.pull("ollama:tiny:q8")

    assert tree_snapshot(models_dir) == before


def test_an_unknown_ollama_model_lists_the_tags_it_has(store, ollama):
    with pytest.raises(PullError, match="has no model `tiny:7b`") as caught:
        store.pull("ollama:tiny:7b")
    assert "q8" in caught.value.hint

    with pytest.raises(PullError, match="has no model `nothing:latest`") as caught:
        store.pull("ollama:nothing")
    assert "ollama pull nothing:latest" in caught.value.hint


# --- LM Studio ---------------------------------------------------------------------------------------


@pytest.fixture
def lmstudio(tmp_path, monkeypatch, q8_gguf, tiny_gguf):
    """~/.lmstudio/models/someone/Tiny-GGUF with two quantizations and a vision projector."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LMSTUDIO_MODELS", raising=False)
    folder = tmp_path / "home" / ".lmstudio" / "models" / "someone" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    (folder / "tiny-Q8_0.gguf").write_bytes(q8_gguf.read_bytes())
    (folder / "tiny-F32.gguf").write_bytes(tiny_gguf.read_bytes())
    (folder / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF projector")
    return folder


def test_pull_from_lmstudio_picks_the_quantization_and_links_it(store, lmstudio):
    model = store.pull("lmstudio:someone/Tiny-GGUF:q8_0")  # the tag is matched case-insensitively

    m = model.manifest
    assert (model.name, m.source) == ("someone/Tiny-GGUF-q8_0", "lmstudio:someone/Tiny-GGUF/tiny-Q8_0.gguf")
    assert os.stat(model.path / GGUF_FILE).st_ino == os.stat(lmstudio / "tiny-Q8_0.gguf").st_ino
    assert (m.quantization, m.origin["gguf_link"]) == ("Q8_0", "hardlink")


def test_lmstudio_without_a_quantization_lists_them(store, lmstudio):
    with pytest.raises(PullError, match="holds 2 GGUF files; say which quantization") as caught:
        store.pull("lmstudio:someone/Tiny-GGUF")
    assert "F32, Q8_0" in caught.value.hint and "lmstudio:someone/Tiny-GGUF:QUANT" in caught.value.hint

    with pytest.raises(PullError, match="has no Q4_K_M GGUF") as caught:
        store.pull("lmstudio:someone/Tiny-GGUF:Q4_K_M")
    assert "F32, Q8_0" in caught.value.hint


def test_lmstudio_file_names_one_exactly(store, lmstudio):
    model = store.pull("lmstudio:someone/Tiny-GGUF", file="tiny-F32.gguf")
    assert (model.name, model.manifest.quantization) == ("someone/tiny-F32", "F32")


def test_lmstudio_older_store_and_override(store, lmstudio, tmp_path, monkeypatch):
    old = tmp_path / "home" / ".cache" / "lm-studio" / "models" / "old" / "Only-GGUF"
    old.mkdir(parents=True)
    (old / "only-Q8_0.gguf").write_bytes((lmstudio / "tiny-Q8_0.gguf").read_bytes())
    assert store.pull("lmstudio:old/Only-GGUF").manifest.quantization == "Q8_0"

    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "elsewhere"))
    with pytest.raises(PullError, match="LM Studio has no model someone/Tiny-GGUF") as caught:
        store.pull("lmstudio:someone/Tiny-GGUF:Q8_0")
    assert str(tmp_path / "elsewhere") in caught.value.hint


@pytest.mark.parametrize("text", ["lmstudio:just-a-name", "lmstudio:a/b/c", "ollama:a/b/c/d", "ollama:"])
def test_malformed_names_are_refused(store, text):
    with pytest.raises(PullError, match="is not an (Ollama|LM Studio) model") as caught:
        store.pull(text)
    assert caught.value.hint


def test_an_ollama_store_on_another_file_system_is_symlinked(store, q8_gguf, monkeypatch):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(store.models_dir).st_dev:
        pytest.skip("needs a second file system (/dev/shm)")
    import shutil

    root = shm / f"zllm-test-ollama-{os.getpid()}"
    try:
        add_ollama_model(root, "tiny", "q8", q8_gguf.read_bytes())
        monkeypatch.setenv("OLLAMA_MODELS", str(root))
        model = store.pull("ollama:tiny:q8")
        stored = model.path / GGUF_FILE
        blob = root / "blobs" / f"sha256-{hashlib.sha256(q8_gguf.read_bytes()).hexdigest()}"
        assert model.manifest.origin["gguf_link"] == "symlink" and stored.is_symlink()
        assert gguf_weights(model.path) == blob.resolve()  # the loader gets the real file
        store.remove("tiny-q8")
        assert blob.is_file()  # removing the model removes the link, never Ollama's blob
    finally:
        shutil.rmtree(root, ignore_errors=True)
