"""Fixtures for engine tests: the tiny Qwen3 model, loaded once per session on one thread."""

import pytest
import torch

from tests.support.tiny_models import tiny_llama_dir, tiny_qwen_dir
from zllm.engine.torch.loader import load_model

torch.set_num_threads(1)  # 2 shared cores on this machine


@pytest.fixture(scope="session")
def tiny_qwen():
    return load_model(tiny_qwen_dir(), device="cpu", threads=1)


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model(tiny_llama_dir(), device="cpu", threads=1)
