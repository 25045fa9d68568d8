"""The runtime side of the prefix cache: build it for a loaded model, with budgets from the settings.

    cache = build_prefix_cache(loaded, runner, config)   # None when the model's KV cannot be cached
    lease = cache.acquire(namespace, prompt_ids, ...)     # kvcache speaks tensors and token ids only
    kv = runner.open(lease)                               # the engine's sequence over the lease's buffers

Default budgets: the device tier gets a fraction of the memory left after loading the model (GPU) or of the
RAM available (CPU); the SSD tier 10 GiB or half the free disk under the cache dir, whichever is smaller.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from zllm.engine.loaded import LoadedModel
from zllm.kvcache import CacheConfig, model_key, template_hash, weights_identity
from zllm.kvcache.sequence_cache import SequencePrefixCache

if TYPE_CHECKING:  # the torch backend's; imported in the functions that serve it (the llama.cpp path never does)
    from zllm.engine.torch.runner import ModelRunner
    from zllm.engine.torch.cache.prefix_cache import PrefixCache
from zllm.runtime.detokenizer import raw_decoder

log = logging.getLogger("zllm.runtime")

MiB = 1 << 20
GPU_FREE_FRACTION = 0.5  # of the memory still free after the model loaded (activations need the rest)
CPU_AVAILABLE_FRACTION = 0.25  # of the RAM available at start (the machine is shared)
SSD_DEFAULT_BYTES = 10 << 30


def served_model_key(loaded: LoadedModel) -> str:
    """Everything about the served model that makes its KV incompatible with another's (the backend too: llama.cpp
    and torch compute the same model's KV differently)."""
    dtype = loaded.quantization if loaded.backend == "torch" else f"{loaded.backend}:{loaded.quantization}"
    template = template_hash(getattr(loaded.tokenizer, "chat_template", None))
    return model_key(weights_identity(loaded.path), dtype, template)


def cache_config_from_settings(settings, loaded: LoadedModel, model: str) -> CacheConfig:
    """`settings` is a zllm.config.Settings (cache_budget_mb, cache_rounds, ssd_cache, ssd_cache_mb, ...)."""
    ssd_dir = settings.ssd_cache_dir if settings.ssd_cache else None
    device_budget = (loaded.engine.kv_bytes if loaded.engine is not None
                     else settings.cache_budget_mb * MiB or default_device_budget(loaded.device))
    return CacheConfig(
        device_budget_bytes=device_budget,
        rounds=settings.cache_rounds,
        ssd_dir=ssd_dir,
        ssd_budget_bytes=settings.ssd_cache_mb * MiB or (default_ssd_budget(ssd_dir) if ssd_dir else 0),
        ssd_min_tokens=settings.ssd_min_tokens,
        model=model,
    )


def default_device_budget(device) -> int:
    """`device`: the torch device of the model (a torch backend's only; llama.cpp sizes its own pool)."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_FREE_FRACTION)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on Linux/macOS
        available = 8 << 30
    return int(available * CPU_AVAILABLE_FRACTION)


def default_ssd_budget(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return min(SSD_DEFAULT_BYTES, shutil.disk_usage(directory).free // 2)


def build_prefix_cache(loaded: LoadedModel, runner: ModelRunner, config: CacheConfig | None, *,
                       max_batch: int = 8) -> PrefixCache | SequencePrefixCache | None:
    """The model's prefix cache, or None when its KV is not plain full-attention per-layer tensors."""
    if loaded.engine is not None:
        return build_sequence_cache(loaded, config, max_batch)
    import torch

    from zllm.engine.torch.kv_layers import supports_working_buffers
    from zllm.engine.torch.cache.prefix_cache import PrefixCache
    from zllm.engine.torch.cache.state import KVLayout

    if not supports_working_buffers(runner.config):
        log.warning("prefix cache off: %s has sliding-window/linear-attention/shared KV layers",
                    type(loaded.model).__name__)
        return None
    with torch.inference_mode():
        layout = KVLayout.of(runner.probe_kv_state())
    key = served_model_key(loaded)
    if config is None:
        config = CacheConfig(device_budget_bytes=default_device_budget(loaded.device), model=key)
    cache = PrefixCache(config, layout, loaded.device,
                        decode=raw_decoder(loaded.tokenizer, skip_special_tokens=False), cost_key=key)
    log.info("prefix cache: device budget %d MB, %d rounds, %d bytes/token%s", config.device_budget_bytes // MiB,
             config.rounds, layout.bytes_per_token,
             f", SSD tier {config.ssd_dir} ({config.ssd_budget_bytes // MiB} MB)" if config.ssd_dir else "")
    return cache


def build_sequence_cache(loaded: LoadedModel, config: CacheConfig | None, max_batch: int) -> SequencePrefixCache:
    """llama.cpp's cache: entries are sequences in its KV pool; snapshots are its exported sequence state."""
    engine, key = loaded.engine, served_model_key(loaded)
    config = config or CacheConfig(device_budget_bytes=engine.kv_bytes, model=key)
    if config.ssd_dir is not None:  # a backend's own state format: its own directory beside the tensor tier's
        config = replace(config, ssd_dir=config.ssd_dir.with_name(f"{config.ssd_dir.name}-{loaded.backend}"))
    cache = SequencePrefixCache(config, engine, cells=engine.cells, bytes_per_token=engine.bytes_per_token,
                                layout=f"{key}:{engine.bytes_per_token}", spare_sequences=max_batch + 1,
                                decode=raw_decoder(loaded.tokenizer, skip_special_tokens=False))
    log.info("prefix cache (llama.cpp): %d KV cells (%d MB), %d bytes/token%s", engine.cells,
             engine.kv_bytes // MiB, engine.bytes_per_token, f", SSD tier {config.ssd_dir}" if config.ssd_dir else "")
    return cache

