"""Which backend serves a model directory: GGUF on llama.cpp, safetensors on torch, an override either way
(refused where it cannot work), and the reason `zllm ps` shows."""

from __future__ import annotations

import importlib.util

import pytest

from zllm.engine.select import choose_backend
from zllm.errors import ConfigError

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


@pytest.fixture
def gguf_dir(tmp_path):
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "model.gguf").write_bytes(b"GGUF")
    return tmp_path / "gguf"


def test_auto_serves_safetensors_on_torch(tmp_path) -> None:
    assert choose_backend("auto", tmp_path) == ("torch", "safetensors weights run on transformers")


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_auto_serves_gguf_on_llama_cpp(gguf_dir) -> None:
    assert choose_backend("auto", gguf_dir) == ("llamacpp", "GGUF weights run on llama.cpp as they are")


def test_overrides_say_so_and_a_safetensors_model_cannot_run_on_llama_cpp(tmp_path, gguf_dir) -> None:
    assert choose_backend("torch", gguf_dir) == ("torch", "--backend torch (GGUF dequantized at load)")
    assert choose_backend("llamacpp", gguf_dir) == ("llamacpp", "--backend llamacpp")
    with pytest.raises(ConfigError, match="serves GGUF models") as refused:
        choose_backend("llamacpp", tmp_path)
    assert "zllm pull" in refused.value.hint
    with pytest.raises(ConfigError, match="auto, torch or llamacpp"):
        choose_backend("vllm", tmp_path)
