"""Fixtures for inspection tests: a store holding the tiny Qwen model (real tokenizer and template) and the
daemon's renderer for it, loaded once per session (the file-level helpers find the same cached renderer)."""

from pathlib import Path

import pytest

from tests.unit.inspect.tiny_store import TINY, linked_store
from zllm.inspect import load_renderer
from zllm.models.names import dir_name


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # one store per session, whichever package's tests ask first (tests/unit/diagnosis uses these fixtures
    # too): the renderer loaded for it (seconds) is cached by its directory
    path = tmp_path_factory.getbasetemp() / "zllm-data-tiny-qwen"
    return path if path.is_dir() else linked_store(path)


@pytest.fixture(scope="session")
def renderer(tiny_data_dir: Path):
    return load_renderer(tiny_data_dir / "models" / dir_name(TINY))


@pytest.fixture()
def tiny_env(tiny_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ZLLM_* settings pointing at the tiny store (no served window set: the model's own applies)."""
    monkeypatch.setenv("ZLLM_DATA_DIR", str(tiny_data_dir))
    monkeypatch.delenv("ZLLM_CONTEXT_LENGTH", raising=False)
    monkeypatch.delenv("ZLLM_MODEL", raising=False)
    return tiny_data_dir
