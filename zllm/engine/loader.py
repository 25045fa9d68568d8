"""Load a model directory (safetensors + config + tokenizer, as `save_pretrained` writes it) for inference.

`device="auto"` picks cuda when present, else cpu; `dtype="auto"` picks bfloat16 on cuda and float32 on cpu
(bf16 matmuls are ~5x slower on AVX2 CPUs, see design/PERF.md). Attention is SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from zllm.errors import ConfigError

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

    def __post_init__(self) -> None:
        assert self.context_length > 0, "context_length is resolved at load time"


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
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa")
    model.to(torch_device).eval()
    return LoadedModel(
        path=path,
        model=model,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        context_length=_context_length(model, context_length),
        threads=threads,
    )


def _context_length(model: PreTrainedModel, override: int) -> int:
    native = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if override > 0:
        # a longer window than the model was trained for is allowed (RoPE scaling users know what they do)
        return override
    if not native:
        raise ConfigError("the model config has no max_position_embeddings", hint="set --context-length")
    return int(native)
