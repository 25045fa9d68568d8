"""A failed, interrupted or killed pull leaves the store exactly as it was; leftovers are cleaned on open."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from zllm.errors import PullError
from zllm.models import ModelStore
from zllm.models.aliases import ALIASES
from zllm.models.sources import Fetched


@dataclass(frozen=True)
class HalfThenFail:
    """A source that writes part of a model, then fails the way a real one might."""

    error: BaseException
    default_name: str = "half"

    def fetch(self, stage, progress) -> Fetched:
        (stage.model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (stage.model / "model.safetensors").write_bytes(b"\0" * 1000)
        (stage.work / "download.part").write_bytes(b"\0" * 1000)
        raise self.error


@pytest.fixture
def store_with_a_model(store, tiny_model_dir):
    store.pull(str(tiny_model_dir), name="tiny")
    return store


@pytest.mark.parametrize(
    "error", [PullError("network down"), OSError(28, "No space left on device"), KeyboardInterrupt()]
)
def test_a_source_failing_midway_changes_nothing(store_with_a_model, models_dir, tree_snapshot, monkeypatch, error):
    monkeypatch.setitem(ALIASES, "half", HalfThenFail(error))
    before = tree_snapshot(models_dir)

    with pytest.raises((PullError, KeyboardInterrupt)) as caught:
        store_with_a_model.pull("half")

    assert tree_snapshot(models_dir) == before
    if isinstance(error, OSError):  # anything unexpected still reaches callers as a PullError
        assert caught.type is PullError and "No space left" in caught.value.message


def test_a_failed_forced_pull_keeps_the_old_model(store_with_a_model, models_dir, tree_snapshot, monkeypatch):
    monkeypatch.setitem(ALIASES, "half", HalfThenFail(PullError("network down")))
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError):
        store_with_a_model.pull("half", name="tiny", force=True)

    assert tree_snapshot(models_dir) == before
    assert store_with_a_model.get("tiny").manifest.source.startswith("dir:")


def test_a_corrupt_gguf_changes_nothing(store_with_a_model, models_dir, tree_snapshot, tmp_path):
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(4096))
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="not a readable GGUF"):
        store_with_a_model.pull(str(corrupt))

    assert tree_snapshot(models_dir) == before


def test_a_truncated_safetensors_changes_nothing(
    store_with_a_model, models_dir, tree_snapshot, tmp_path, tiny_model_dir
):
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="not a readable safetensors"):
        store_with_a_model.pull(str(truncated))

    assert tree_snapshot(models_dir) == before


def test_a_model_without_chat_template_changes_nothing(
    store_with_a_model, models_dir, tree_snapshot, tmp_path, tiny_model_dir
):
    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((plain / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="no chat template"):
        store_with_a_model.pull(str(plain))

    assert tree_snapshot(models_dir) == before


def _stage_leftover(models_dir: Path, token: str) -> Path:
    leftover = models_dir / ".staging" / token
    (leftover / "model").mkdir(parents=True)
    (leftover / "model" / "model.safetensors").write_bytes(b"\0" * 100)
    (leftover / "lock").touch()
    return leftover


def test_stale_staging_dirs_are_cleaned_on_open(store_with_a_model, models_dir):
    dead = _stage_leftover(models_dir, "deadbeef")  # its process is gone: nobody holds the lock
    (models_dir / ".staging" / "nolock").mkdir()  # died before taking the lock

    ModelStore(models_dir)

    assert list((models_dir / ".staging").iterdir()) == []
    assert not dead.exists()


def test_a_live_pulls_staging_dir_is_left_alone(store_with_a_model, models_dir):
    live = _stage_leftover(models_dir, "cafebabe")
    fd = os.open(live / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the pulling process (e.g. `zllm pull` while `zllm serve` starts) does
    try:
        ModelStore(models_dir)
        assert (live / "model" / "model.safetensors").exists()
    finally:
        os.close(fd)

    ModelStore(models_dir)
    assert not live.exists()


def test_a_model_orphaned_mid_swap_is_restored(store_with_a_model, models_dir):
    """A `--force` killed between its two renames: the old model sits in staging, its name is empty."""
    leftover = models_dir / ".staging" / "0badf00d"
    leftover.mkdir()
    (leftover / "lock").touch()
    os.rename(models_dir / "tiny", leftover / "replaced")
    assert not store_with_a_model.has("tiny")

    reopened = ModelStore(models_dir)

    assert reopened.has("tiny")
    assert list((models_dir / ".staging").iterdir()) == []
