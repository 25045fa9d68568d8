"""Load a GGUF model directory (zllm/models/weights.py's layout) for the llama.cpp backend.

    model.gguf      → llama.cpp, as it is (no dequantization)
    config.json     → transformers' config read from the GGUF: EOS ids, vocabulary size, context length
    tokenizer files → the prompt renderer (its ids equal llama.cpp's own tokenization: tests say so)

The KV pool is sized once, at load (llama.cpp allocates it whole): `--cache-budget-mb` when set, else twice
the context window (at least 8K tokens, at most 64K), so one full-window request and cached prefixes fit.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from transformers.utils import logging as transformers_logging

from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine, read_quantization
from zllm.engine.loader import GGUF_FILE, LoadedModel, _context_length
from zllm.errors import ConfigError

MiB = 1 << 20
MIN_CELLS, MAX_CELLS = 8192, 65536


def load_gguf_model(path: str | Path, *, threads: int = 0, context_length: int = 0, cache_budget_mb: int = 0,
                    max_batch: int = 8, reason: str = "GGUF weights run on llama.cpp", ubatch: int = 512,
                    gpu_layers: int = -1) -> LoadedModel:
    path = Path(path)
    gguf = path / GGUF_FILE
    if not gguf.is_file():
        raise ConfigError(f"{path} holds no {GGUF_FILE}", hint="the llama.cpp backend serves GGUF models")
    transformers_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    window = _context_length(config, context_length)
    engine = LlamaCppEngine(str(gguf.resolve()), ContextSettings(
        cells=_cells(window, cache_budget_mb, gguf), max_sequences=min(256, max(64, 4 * max_batch)),
        threads=threads, ubatch=ubatch, gpu_layers=gpu_layers))
    return LoadedModel(path=path, model=None, tokenizer=tokenizer, device=engine.device,
                       dtype=read_quantization(str(gguf)), context_length=window, threads=threads,
                       backend="llamacpp", backend_reason=reason, engine=engine, model_config=config,
                       generation_eos=_generation_eos(path))


def _cells(window: int, cache_budget_mb: int, gguf: Path) -> int:
    if cache_budget_mb > 0:
        per_token = LlamaCppEngine.estimate_bytes_per_token(str(gguf.resolve()))
        return max(window, cache_budget_mb * MiB // per_token)
    return max(window, min(MAX_CELLS, max(MIN_CELLS, 2 * window)))


def _generation_eos(path: Path):
    try:
        return GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:  # no generation_config.json: the config's own EOS applies
        return None
