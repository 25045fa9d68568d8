"""Load a GGUF model directory (zllm/models/weights.py's layout) for the llama.cpp backend.

    model.gguf      → llama.cpp, as it is (no dequantization)
    config.json     → the config transformers wrote from the GGUF at pull: EOS ids, vocabulary size, context
                      length (read as JSON: transformers' AutoConfig would import torch)
    tokenizer files → the prompt renderer, on `tokenizers` + jinja2 (prompt/tokenizer_files.py; its ids equal
                      llama.cpp's own tokenization: tests say so)

Nothing here imports torch or transformers (a test loads a model in a fresh process and checks sys.modules).

`exact_cache` and `cache_type` (the settings) pick the pool's cell type, attention kernel and the engine's exact
mode: backend.EXACT_ATTENTION, where a cached prefix answers bit for bit like a cold prefill (Q8_0 cells, no
1-row matmul, cells kept in position order), backend.Q8_0_ATTENTION (`--cache-type q8_0`: Q8_0 cells, 1.88x the
tokens per MB, flash attention on) or backend.FAST_ATTENTION (F16 cells, llama.cpp's own choice of kernel).
Q8_0 cells hold 32-element blocks: on a model whose heads are not a multiple of 32 wide exact mode keeps F16
cells (tiny test models), and an explicit q8_0 is refused.
`uniform_rows` (a speculating server) pads 1-token decodes so that verifying a draft gives the bits decoding it
token by token gives (ContextSettings.uniform_rows); without `pad_allowed` (--speculative auto) only where no pad
row is needed (measured at load), else it decodes as a server that does not speculate. `measures_file` keeps
those load-time measures across loads (load_measures.py).

`rpc_servers` (HOST:PORT of llama.cpp `rpc-server`s) are registered before the model loads, and llama.cpp
places its layers on them (rpc.py); the placement it logged joins the backend's reason (`zllm ps`).

The KV pool is sized once, at load (llama.cpp allocates it whole): `--cache-budget-mb` when set, else twice
the context window (at least 8K tokens, at most 64K), so one full-window request and cached prefixes fit.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from zllm.config import f16_cannot_be_exact
from zllm.engine.llamacpp.backend import (
    EXACT_ATTENTION,
    FAST_ATTENTION,
    Q8_0_ATTENTION,
    Attention,
    ContextSettings,
    LlamaCppEngine,
    read_quantization,
)
from zllm.engine.llamacpp.load_measures import LoadMeasures
from zllm.engine.llamacpp.model import LlamaCppModel, ModelConfig
from zllm.engine.llamacpp.rpc import load_log, placement, register_rpc_servers
from zllm.engine.loaded import window_length
from zllm.errors import ConfigError
from zllm.model_files import GGUF_FILE
from zllm.prompt.tokenizer_files import TokenizerFiles, read_model_json

MiB = 1 << 20
MIN_CELLS, MAX_CELLS = 8192, 65536


def load_gguf_model(path: str | Path, *, threads: int = 0, context_length: int = 0, cache_budget_mb: int = 0,
                    max_batch: int = 8, reason: str = "GGUF weights run on llama.cpp", ubatch: int = 512,
                    gpu_layers: int = -1, exact_cache: bool = True, cache_type: str = "auto",
                    uniform_rows: bool = False, pad_allowed: bool = True, rpc_servers: tuple[str, ...] = (),
                    rpc_backend: str = "", measures_file: Path | None = None) -> LlamaCppModel:
    path = Path(path)
    gguf = path / GGUF_FILE
    if not gguf.is_file():
        raise ConfigError(f"{path} holds no {GGUF_FILE}", hint="the llama.cpp backend serves GGUF models")
    attention = pool_attention(gguf, exact_cache=exact_cache, cache_type=cache_type)  # refused before loading
    if rpc_servers:  # before anything loads: llama.cpp places layers on the devices registered at load
        register_rpc_servers(rpc_servers, backend_path=rpc_backend)
    config = ModelConfig.from_dir(path)
    tokenizer = TokenizerFiles.from_dir(path)
    window = window_length(config, context_length)
    with load_log() if rpc_servers else nullcontext([]) as log_lines:
        engine = LlamaCppEngine(str(gguf.resolve()), ContextSettings(
            cells=_cells(window, cache_budget_mb, gguf, attention.kv_type),
            max_sequences=min(256, max(64, 4 * max_batch)), threads=threads, ubatch=ubatch, gpu_layers=gpu_layers,
            flash_attention=attention.flash_attention, kv_type=attention.kv_type, exact=attention.exact,
            uniform_rows=uniform_rows, pad_allowed=pad_allowed),
            measures=LoadMeasures(measures_file) if measures_file else None)
    if rpc_servers:
        reason += f"; weights on llama.cpp RPC: {placement(log_lines)}"
    return LlamaCppModel(path=path, engine=engine, tokenizer=tokenizer, model_config=config,
                         quantization=read_quantization(engine), context_length=window, threads=threads,
                         backend_reason=reason, generation_eos=_generation_eos(path))


def pool_attention(gguf: Path, *, exact_cache: bool, cache_type: str) -> Attention:
    """The KV pool's cells and kernel for the settings (`cache_type` "auto": f16, or q8_0 under exact_cache)."""
    if cache_type == "f16" and exact_cache:
        raise f16_cannot_be_exact()
    fits = LlamaCppEngine.exact_attention_fits(str(gguf.resolve()))
    if cache_type == "q8_0" and not fits:
        raise ConfigError(f"{gguf.parent.name}'s KV heads are not a multiple of 32 wide: Q8_0 cells cannot hold them",
                          hint="serve it with --cache-type f16 (or auto)")
    if exact_cache and fits:
        return EXACT_ATTENTION
    return Q8_0_ATTENTION if cache_type == "q8_0" else FAST_ATTENTION


def _cells(window: int, cache_budget_mb: int, gguf: Path, kv_type: int) -> int:
    if cache_budget_mb > 0:
        per_token = LlamaCppEngine.estimate_bytes_per_token(str(gguf.resolve()), kv_type)
        return max(window, cache_budget_mb * MiB // per_token)
    return max(window, min(MAX_CELLS, max(MIN_CELLS, 2 * window)))


def _generation_eos(path: Path):
    """The generation config's EOS id(s); None without a generation_config.json (the config's own apply)."""
    return read_model_json(path / "generation_config.json").get("eos_token_id")

