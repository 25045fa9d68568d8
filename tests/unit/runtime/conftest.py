"""Fixtures for runtime tests: the tiny Qwen3 model, loaded once per session on one thread."""

import pytest
import torch

from tests.support.tiny_models import tiny_qwen_dir
from zllm.engine.torch.loader import load_model
from zllm.engine.torch.runner import ModelRunner

torch.set_num_threads(1)  # 2 shared cores on this machine


@pytest.fixture(scope="session")
def tiny_qwen():
    return load_model(tiny_qwen_dir(), device="cpu", threads=1)


@pytest.fixture(scope="module")
def runner(tiny_qwen) -> ModelRunner:
    return ModelRunner(tiny_qwen.model)
