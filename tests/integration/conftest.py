"""Integration fixtures: a real daemon serving a tiny random-weight model over the real Qwen tokenizer."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.support.daemon import Daemon
from tests.support.tiny_models import tiny_qwen_dir
from zllm.models import ModelStore

TINY = "tiny-qwen"
# small window so "prompt too long" and "max_tokens clamped to the window" are cheap to reach
CONTEXT = 192


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("zllm-data")
    ModelStore(data_dir / "models").pull(str(tiny_qwen_dir()), name=TINY)
    return data_dir


def linked_data_dir(shared: Path, where: Path) -> Path:
    """A data dir of its own (a daemon locks its data dir: one daemon per store) whose `models` is the shared
    store's, so tests that run a second daemon beside a module-scoped one need not pull again."""
    data_dir = where / "data"
    if not data_dir.exists():
        data_dir.mkdir(parents=True)
        (data_dir / "models").symlink_to(shared / "models", target_is_directory=True)
    return data_dir


@pytest.fixture(scope="module")
def daemon(tiny_data_dir: Path):
    proc = Daemon(tiny_data_dir, TINY, "--context-length", str(CONTEXT)).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=60)
