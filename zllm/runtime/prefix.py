"""The runtime side of the prefix cache: budgets from the settings, the served model's KV identity, and the
cache the backend builds for it.

    cache = build_prefix_cache(loaded, config)            # None when the model's KV cannot be cached
    lease = cache.acquire(namespace, prompt_ids, ...)     # kvcache speaks token ids and the engine's state only
    seq = loaded.engine.open(lease)                       # the engine's sequence over the lease's prefix

Default budgets: the device tier's is the backend's (engine/loaded.py: device_cache_budget); the SSD tier gets
10 GiB or half the free disk under the cache dir, whichever is smaller.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from zllm.engine.loaded import LoadedModel
from zllm.kvcache import CacheConfig, model_key, template_hash, weights_identity
from zllm.runtime.detokenizer import raw_decoder

MiB = 1 << 20
SSD_DEFAULT_BYTES = 10 << 30


def served_model_key(loaded: LoadedModel) -> str:
    """Everything about the served model that makes its KV incompatible with another's (the backend too: llama.cpp
    and torch compute the same model's KV differently)."""
    template = template_hash(getattr(loaded.tokenizer, "chat_template", None))
    return model_key(weights_identity(loaded.path), loaded.cache_dtype, template)


def cache_config_from_settings(settings, loaded: LoadedModel, model: str) -> CacheConfig:
    """`settings` is a zllm.config.Settings (cache_budget_mb, cache_rounds, ssd_cache, ssd_cache_mb, ...)."""
    ssd_dir = settings.ssd_cache_dir if settings.ssd_cache else None
    return CacheConfig(
        device_budget_bytes=loaded.device_cache_budget(settings.cache_budget_mb),
        rounds=settings.cache_rounds,
        ssd_dir=ssd_dir,
        ssd_budget_bytes=settings.ssd_cache_mb * MiB or (default_ssd_budget(ssd_dir) if ssd_dir else 0),
        ssd_min_tokens=settings.ssd_min_tokens,
        park_budget_bytes=settings.cache_ram_mb * MiB,
        model=model,
    )


def default_ssd_budget(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return min(SSD_DEFAULT_BYTES, shutil.disk_usage(directory).free // 2)


def build_prefix_cache(loaded: LoadedModel, config: CacheConfig | None, *, max_batch: int = 8):
    """The model's prefix cache (`config` None: the device tier only, with the backend's default budget), or None
    when the backend cannot cache its KV."""
    key = served_model_key(loaded)
    config = config or CacheConfig(device_budget_bytes=loaded.device_cache_budget(0), model=key)
    return loaded.build_prefix_cache(config, key=key, max_batch=max_batch,
                                     decode=raw_decoder(loaded.tokenizer, skip_special_tokens=False))
