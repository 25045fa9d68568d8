"""The store: list/get/has/remove, manifests, names on disk, idempotent and forced pulls, local directories."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from zllm.errors import ModelNotFound, PullError
from zllm.models import MANIFEST_FILE, ModelStore
from zllm.models.files import listing_digest, sha256_file


def test_pull_a_local_dir_writes_a_complete_manifest(store, tiny_model_dir):
    started = time.time()

    model = store.pull(str(tiny_model_dir), name="tiny")

    m = model.manifest
    assert (model.name, m.name, model.path) == ("tiny", "tiny", store.models_dir / "tiny")
    assert m.source == f"dir:{tiny_model_dir.resolve()}"
    assert (m.architecture, m.model_type, m.context_length, m.dtype) == ("LlamaForCausalLM", "llama", 256, "float32")
    assert started <= m.added_at <= time.time()
    stored_files = {p.name for p in model.path.iterdir()} - {MANIFEST_FILE}
    assert (
        set(m.files) == stored_files >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    )
    assert all(sha256_file(model.path / name) == digest for name, digest in m.files.items())
    assert m.sha256 == listing_digest(m.files)
    assert m.size_bytes == sum((model.path / name).stat().st_size for name in m.files)
    on_disk = json.loads((model.path / MANIFEST_FILE).read_text())
    assert on_disk["name"] == "tiny" and on_disk["format"] == 1


def test_a_pulled_model_loads_with_its_chat_template(store, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = store.pull(str(tiny_model_dir), name="tiny")

    tokenizer = AutoTokenizer.from_pretrained(model.path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert AutoModelForCausalLM.from_pretrained(model.path).config.num_hidden_layers == 2


def test_list_get_has_remove(store, tiny_model_dir):
    assert store.list() == [] and not store.has("b")
    store.pull(str(tiny_model_dir), name="b")
    store.pull(str(tiny_model_dir), name="a")

    assert [m.name for m in store.list()] == ["a", "b"]
    assert store.has("a") and store.get("a").path == store.models_dir / "a"

    store.remove("a")

    assert [m.name for m in store.list()] == ["b"]
    assert not (store.models_dir / "a").exists()
    assert list((store.models_dir / ".staging").iterdir()) == []


def test_model_not_found_names_the_available_models(store, tiny_model_dir):
    store.pull(str(tiny_model_dir), name="tiny")

    with pytest.raises(ModelNotFound) as caught:
        store.get("nope")
    assert caught.value.model == "nope" and caught.value.hint == "available: tiny"
    with pytest.raises(ModelNotFound):
        store.remove("nope")
    with pytest.raises(ModelNotFound):
        store.get("../tiny")  # not a name at all: still just "not found"


def test_slashes_are_escaped_on_disk_but_not_in_names(store, tiny_model_dir):
    model = store.pull(str(tiny_model_dir), name="org/tiny@v2")

    assert model.path == store.models_dir / "org--tiny@v2"
    assert [m.name for m in store.list()] == ["org/tiny@v2"]
    assert store.get("org/tiny@v2").path == model.path
    assert not store.has("org--tiny@v2")  # the directory name is not the model's name


@pytest.mark.parametrize("bad", ["a--b", "../x", ".hidden", "a b", "a/", "", "x" * 201])
def test_invalid_names_are_refused(store, tiny_model_dir, bad):
    with pytest.raises(PullError, match="not a valid model name"):
        store.pull(str(tiny_model_dir), name=bad)


def test_a_model_dir_default_name_comes_from_its_directory(store, tiny_model_dir, tmp_path):
    source = tmp_path / "My Model v1"
    shutil.copytree(tiny_model_dir, source)

    assert store.pull(str(source)).name == "My-Model-v1"


def test_pull_is_idempotent(store, tiny_model_dir):
    first = store.pull(str(tiny_model_dir), name="tiny")
    mtime = (first.path / MANIFEST_FILE).stat().st_mtime_ns

    again = store.pull(str(tiny_model_dir), name="tiny")

    assert again == first
    assert (again.path / MANIFEST_FILE).stat().st_mtime_ns == mtime


def test_force_replaces_the_model(store, tiny_model_dir, tmp_path):
    store.pull(str(tiny_model_dir), name="tiny")
    changed = tmp_path / "changed"
    shutil.copytree(tiny_model_dir, changed)
    (changed / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7}))

    replaced = store.pull(str(changed), name="tiny", force=True)

    assert replaced.manifest.source == f"dir:{changed.resolve()}"
    assert json.loads((replaced.path / "generation_config.json").read_text()) == {"max_new_tokens": 7}
    assert [m.name for m in store.list()] == ["tiny"]
    assert list((store.models_dir / ".staging").iterdir()) == []


def test_a_store_directory_without_manifest_is_not_a_model(store, tiny_model_dir):
    shutil.copytree(tiny_model_dir, store.models_dir / "stray")

    assert store.list() == [] and not store.has("stray")
    # and a pull under that name may take its place
    assert store.pull(str(tiny_model_dir), name="stray").manifest.name == "stray"


def test_pickle_only_dirs_are_refused_with_a_hint(store, tmp_path, tiny_model_dir):
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    shutil.copy(tiny_model_dir / "config.json", pickles)
    (pickles / "pytorch_model.bin").write_bytes(b"not really a pickle")

    with pytest.raises(PullError, match="only pickle weights") as caught:
        store.pull(str(pickles))
    assert "safetensors" in caught.value.hint


def test_a_config_without_architectures_is_refused(store, tmp_path, tiny_model_dir):
    broken = tmp_path / "noarch"
    shutil.copytree(tiny_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    del config["architectures"]
    (broken / "config.json").write_text(json.dumps(config))

    with pytest.raises(PullError, match="architectures"):
        store.pull(str(broken))


@pytest.mark.parametrize(
    "source, message",
    [("no-such-thing", "not a model zllm knows"), ("./missing-dir", "no such file"), ("missing.gguf", "no such file")],
)
def test_unknown_sources_are_clear_errors(store, source, message):
    with pytest.raises(PullError, match=message):
        store.pull(source)


def test_a_second_store_on_the_same_dir_sees_the_same_models(models_dir, tiny_model_dir):
    ModelStore(models_dir).pull(str(tiny_model_dir), name="tiny")

    assert [m.name for m in ModelStore(models_dir).list()] == ["tiny"]


def test_resolve_name_matches_what_pull_stores(store, tiny_model_dir):
    assert store.resolve_name(str(tiny_model_dir)) == tiny_model_dir.name
    assert store.resolve_name("org/x@rev") == "org/x@rev"
    assert store.resolve_name("smollm2") == "smollm2"
    assert store.resolve_name("smollm2", "mine") == "mine"


def test_models_dir_is_created(tmp_path: Path):
    ModelStore(tmp_path / "deep" / "models")
    assert (tmp_path / "deep" / "models" / ".staging").is_dir()
