"""Which engine backend serves a model directory, and loading it there.

    auto      GGUF weights (model.gguf) → llamacpp; safetensors → torch
    torch     transformers (a GGUF is dequantized as it loads: float32 on CPU, several times its file size)
    llamacpp  llama.cpp (GGUF only)

Each backend is one package, imported only when chosen: a torch-only install never loads llama_cpp, and serving
a GGUF on llama.cpp never loads torch or transformers. Both give the runtime one backend object (loaded.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

from zllm.engine.loaded import LoadedModel
from zllm.errors import ConfigError
from zllm.model_files import GGUF_FILE

BACKENDS = ("auto", "torch", "llamacpp")


def choose_backend(requested: str, model_dir: Path) -> tuple[str, str]:
    """(backend, why) for serving `model_dir`."""
    if requested not in BACKENDS:
        raise ConfigError(f"backend must be auto, torch or llamacpp, not {requested!r}")
    is_gguf = (Path(model_dir) / GGUF_FILE).is_file()
    if requested == "llamacpp":
        if not is_gguf:
            raise ConfigError(f"{model_dir} has safetensors weights; the llamacpp backend serves GGUF models",
                              hint="pull the model's GGUF (zllm pull org/name-GGUF:Q4_K_M) or use --backend torch")
        return "llamacpp", "--backend llamacpp"
    if requested == "torch":
        return "torch", "--backend torch" + (" (GGUF dequantized at load)" if is_gguf else "")
    if not is_gguf:
        return "torch", "safetensors weights run on transformers"
    if importlib.util.find_spec("llama_cpp") is None:
        return "torch", "GGUF weights, but llama-cpp-python is not installed (dequantized at load)"
    return "llamacpp", "GGUF weights run on llama.cpp as they are"


def load_for_backend(model_dir: Path, *, backend: str = "auto", device: str = "auto", dtype: str = "auto",
                     threads: int = 0, context_length: int = 0, cache_budget_mb: int = 0,
                     max_batch: int = 8, exact_cache: bool = True, uniform_rows: bool = False,
                     pad_allowed: bool = True, cache_type: str = "auto", rpc_servers: tuple[str, ...] = (),
                     rpc_backend: str = "", measures_file: Path | None = None) -> LoadedModel:
    """`rpc_servers`: llama.cpp rpc-servers to put a GGUF's layers on; `cache_type`: its KV cells' type (the
    llamacpp backend only)."""
    chosen, reason = choose_backend(backend, model_dir)
    if cache_type != "auto" and chosen != "llamacpp":
        raise ConfigError(f"--cache-type {cache_type} sets llama.cpp's KV cells; this model runs on {chosen} "
                          f"({reason}), whose KV cache keeps the model's dtype",
                          hint="serve a GGUF model on llama.cpp, or drop --cache-type (torch: --dtype)")
    if rpc_servers and chosen != "llamacpp":
        raise ConfigError(f"--rpc puts a GGUF's layers on llama.cpp rpc-servers; this model runs on {chosen} "
                          f"({reason})", hint="serve a GGUF model with --backend llamacpp, or drop --rpc")
    if chosen == "llamacpp":
        from zllm.engine.llamacpp.loader import load_gguf_model

        return load_gguf_model(model_dir, threads=threads, context_length=context_length,
                               cache_budget_mb=cache_budget_mb, max_batch=max_batch, reason=reason,
                               exact_cache=exact_cache, cache_type=cache_type, uniform_rows=uniform_rows,
                               pad_allowed=pad_allowed, rpc_servers=rpc_servers, rpc_backend=rpc_backend,
                               measures_file=measures_file)
    from zllm.engine.torch.loader import load_model

    loaded = load_model(model_dir, device=device, dtype=dtype, threads=threads, context_length=context_length)
    return replace(loaded, backend_reason=reason)
