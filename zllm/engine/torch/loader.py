"""Load a model directory (safetensors + config + tokenizer, as `save_pretrained` writes it) for inference:
the torch backend's object for the runtime (backend.TorchModel).

`device="auto"` picks cuda when present, else cpu; `dtype="auto"` picks bfloat16 on cuda and float32 on cpu
(bf16 matmuls are much slower on AVX2 CPUs, see design/PERF.md). Attention is SDPA.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from zllm.engine.loaded import window_length
from zllm.engine.torch.backend import TorchModel
from zllm.engine.torch.runner import apply_threads
from zllm.errors import ConfigError
from zllm.model_files import GGUF_FILE

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available", hint="use --device cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    return _DTYPES[dtype]


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
    context_length: int = 0,
) -> TorchModel:
    """Load `path` for inference. `context_length=0` means the model's own max_position_embeddings."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a model directory (no config.json)")
    apply_threads(threads)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    # a per-tensor "Loading weights" bar is noise in a daemon log: loading a stored model takes a second
    transformers_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    # a GGUF directory on torch (--backend torch): transformers dequantizes it as it loads
    gguf = {"gguf_file": GGUF_FILE} if (path / GGUF_FILE).is_file() else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa", **gguf)
    model.to(torch_device).eval()
    return TorchModel(
        path=path,
        model=model,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        context_length=window_length(model.config, context_length),
        threads=threads,
        backend_reason="safetensors weights run on transformers" if not gguf else "--backend torch (GGUF dequantized)",
    )
