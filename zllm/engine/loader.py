"""Load a model directory (safetensors + config + tokenizer, as `save_pretrained` writes it) for inference.

`device="auto"` picks cuda when present, else cpu; `dtype="auto"` picks bfloat16 on cuda and float32 on cpu
(bf16 matmuls are ~5x slower on AVX2 CPUs, see design/PERF.md). Attention is SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from zllm.errors import ConfigError

# the GGUF a model directory holds (zllm/models/weights.py names the same file; engine/ cannot import models/)
GGUF_FILE = "model.gguf"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference, with the facts the runtime needs about it."""

    path: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    # tokens that prompt + output must fit in (settings override, else the model's max_position_embeddings)
    context_length: int
    # torch intra-op threads the engine thread must use (0 = torch's default)
    threads: int = 0
    # the engine seam's backend that serves it (engine/contract.py), why, and the weights' quantization
    backend: str = "torch"
    backend_reason: str = "safetensors weights run on transformers"
    # a backend built at load time (llama.cpp holds the weights itself; `model` is then None)
    engine: Any = None
    # transformers' config of the model (read from the GGUF for llama.cpp); None: model.config
    model_config: Any = None
    # the generation config's EOS id(s), when the model has one
    generation_eos: Any = None

    def __post_init__(self) -> None:
        assert self.context_length > 0, "context_length is resolved at load time"

    @property
    def config(self):
        return self.model_config if self.model_config is not None else self.model.config

    @property
    def text_config(self):
        return self.config.get_text_config()

    @property
    def quantization(self) -> str:
        return str(self.dtype).removeprefix("torch.")


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


def apply_threads(threads: int) -> None:
    """torch's intra-op thread count; call it on every thread that runs torch work (it is per thread for OpenMP)."""
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
    context_length: int = 0,
) -> LoadedModel:
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
    return LoadedModel(
        path=path,
        model=model,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        context_length=_context_length(model, context_length),
        threads=threads,
        backend_reason="safetensors weights run on transformers" if not gguf else "--backend torch (GGUF dequantized)",
    )


def _context_length(model, override: int) -> int:
    """`model`: a PreTrainedModel or its config."""
    config = getattr(model, "config", model)
    native = getattr(config.get_text_config(), "max_position_embeddings", None)
    if override > 0:
        # a longer window than the model was trained for is allowed (RoPE scaling users know what they do)
        return override
    if not native:
        raise ConfigError("the model config has no max_position_embeddings", hint="set --context-length")
    return int(native)
