"""load_model: device/dtype resolution, context length, errors a user can cause."""

import pytest
import torch

from tests.support.tiny_models import tiny_llama_dir
from zllm.engine.torch.loader import load_model, resolve_device, resolve_dtype
from zllm.engine.torch.packed import PACKED_ATTENTION
from zllm.errors import ConfigError


def test_auto_resolves_to_cpu_float32_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


def test_cuda_without_cuda_is_a_config_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ConfigError):
        resolve_device("cuda")


def test_loaded_model_facts(tiny_qwen) -> None:
    assert tiny_qwen.context_length == 512  # max_position_embeddings
    assert tiny_qwen.dtype == torch.float32 and tiny_qwen.device == torch.device("cpu")
    assert not tiny_qwen.model.training
    # loaded as sdpa; a ModelRunner on the shared fixture may have switched it to the packed attention, which
    # is sdpa itself for every ordinary forward
    assert tiny_qwen.model.config._attn_implementation in ("sdpa", PACKED_ATTENTION)
    assert tiny_qwen.threads == 1


def test_context_length_override() -> None:
    assert load_model(tiny_llama_dir(), device="cpu", threads=1, context_length=128).context_length == 128


def test_not_a_model_dir(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not a model directory"):
        load_model(tmp_path)
