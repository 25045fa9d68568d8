"""`LlamaCppModel`: the llama.cpp backend's object for the runtime (engine/loaded.py) — a GGUF on llama.cpp as it
is, its engine (built at load: llama.cpp holds the weights itself), its prefix cache over the engine's sequences.

Torch-free: the tokenizer is prompt/tokenizer_files.TokenizerFiles and the config is config.json read as JSON.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

from zllm.engine.llamacpp.backend import KV_TYPE_NAMES, LlamaCppEngine
from zllm.engine.llamacpp.kv import LlamaKV
from zllm.engine.loaded import LoadedModel, Weights
from zllm.errors import ConfigError
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.prefix_cache import PrefixCache
from zllm.prompt.tokenizer_files import TokenizerFiles, read_model_json

log = logging.getLogger("zllm.runtime")

MiB = 1 << 20


class ModelConfig(SimpleNamespace):
    """config.json as attributes: what the runtime reads of a model's config (`architectures`, and through
    `get_text_config()` `eos_token_id`, `vocab_size`, `max_position_embeddings`), as transformers' config
    answers it (a multimodal config keeps the language model's under `text_config`)."""

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is not a model directory (no config.json)")
        return cls(**read_model_json(path / "config.json"))

    def get_text_config(self) -> ModelConfig:
        text = getattr(self, "text_config", None)
        return ModelConfig(**text) if isinstance(text, dict) else self


@dataclass(frozen=True, kw_only=True, eq=False)
class LlamaCppModel(LoadedModel):
    backend: ClassVar[str] = "llamacpp"
    path: Path
    engine: LlamaCppEngine
    tokenizer: TokenizerFiles
    model_config: ModelConfig
    quantization: str  # the GGUF's (read_quantization)
    context_length: int
    threads: int = 0
    backend_reason: str = "GGUF weights run on llama.cpp"
    generation_eos: int | list[int] | None = None
    device: str = "cpu"  # its logits are numpy arrays in host memory, whatever device runs its layers
    # draft models loaded for it (load_draft_model): closed with it, once no thread runs the engine
    drafts: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        assert self.context_length > 0, "context_length is resolved at load time"

    @property
    def config(self) -> ModelConfig:
        return self.model_config

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def cache_dtype(self) -> str:
        """The KV identity's number format: the weights', plus the cells' type when it is not F16, and exact mode
        (whose KV bits a non-exact pool computes otherwise). A snapshot then restores only into a pool of its own
        kind: after a restart with another --cache-type or --exact-cache its namespace is another one, a clean
        miss, and the blob stays for a restart with its own kind (or the budget's eviction). F16 adds nothing, so
        the SSD tiers written before --cache-type existed stay valid."""
        cells = "" if self.kv_cache_type == "f16" else f":kv-{self.kv_cache_type}"
        return super().cache_dtype + cells + (":exact" if self.engine.settings.exact else "")

    @property
    def kv_cache_type(self) -> str:
        return KV_TYPE_NAMES[self.engine.settings.kv_type]

    def device_cache_budget(self, budget_mb: int) -> int:
        return self.engine.kv_bytes  # its KV pool was sized at load (the budget setting sized it)

    def build_prefix_cache(self, config: CacheConfig, *, key: str, max_batch: int,
                           decode: Callable[[Sequence[int]], str]) -> PrefixCache:
        """Entries are sequences in its KV pool; snapshots are its exported sequence state."""
        engine = self.engine
        if config.ssd_dir is not None:  # a backend's own state format: its own directory beside the tensor tier's
            config = replace(config, ssd_dir=config.ssd_dir.with_name(f"{config.ssd_dir.name}-{self.backend}"))
        layout = f"{key}:{engine.bytes_per_token}"
        park = min(config.park_budget_bytes if config.park_budget_bytes >= 0 else 8 << 30, quarter_of_ram())
        kv = LlamaKV(engine, layout=layout, spare_sequences=max_batch + 1, park_budget_bytes=park)
        # the config's device budget holds here as on torch; the engine's pool is its upper bound
        budget = min(engine.cells, config.device_budget_bytes // max(engine.bytes_per_token, 1)) * engine.bytes_per_token
        cache = PrefixCache(config, kv, cost_key=f"cost:seq:{layout}", budget_bytes=budget, decode=decode)
        log.info("prefix cache (llama.cpp): %d %s KV cells (%d MB), %d bytes/token%s", engine.cells,
                 self.kv_cache_type, engine.kv_bytes // MiB, engine.bytes_per_token,
                 f", SSD tier {config.ssd_dir}" if config.ssd_dir else "")
        return cache

    def check_draft_model(self) -> None:
        """A GGUF draft model's proposals are verified like prompt lookup's (draft_model.py)."""

    def load_draft_model(self, path: Path, *, dtype: str, threads: int):
        """`path`: a GGUF model directory or a .gguf file; `dtype` is the torch backend's (a GGUF keeps its own)."""
        from zllm.engine.llamacpp.draft_model import LlamaDraftModel, draft_gguf

        draft = LlamaDraftModel(draft_gguf(path), self.engine, threads=threads)
        self.drafts.append(draft)
        log.info("draft model (llama.cpp): %s, %d-token window", draft.path, draft.window)
        return draft

    def free_speculation(self) -> tuple[bool, str]:
        """Measured at load (backend.LlamaCppEngine.needs_pad): exact and free where a verify's rows give 1-token
        decoding's bits with no pad row; a pad row costs every lone step 17-28% (F16 weights, 1 thread). Under
        --exact-cache every lone step has its pad row anyway: a draft or guess takes its place."""
        engine = self.engine
        if engine.settings.exact:
            return True, "--exact-cache pads every lone step anyway: a draft takes the pad row's place"
        if engine.needs_pad is None:
            return False, "llama.cpp measures it only when loaded to speculate"
        if engine.needs_pad:
            return False, (f"{self.quantization} weights: exact drafts need a pad row in every lone step "
                           f"({engine.needs_pad}), 17-28% of a decode step on a turn with nothing to copy")
        return True, (f"{self.quantization} weights: a verify of up to {engine.verify_rows} rows gives 1-token "
                      f"decoding's bits, no pad row")

    def weights(self) -> Weights:
        architectures = getattr(self.config, "architectures", None)
        return Weights(architecture=(architectures or ["-"])[0], parameters=self.engine.parameters,
                       model_bytes=self.engine.model_bytes)

    def close(self) -> None:
        for draft in self.drafts:
            draft.close()
        self.engine.close()


def quarter_of_ram() -> int:
    """The most host RAM parked sequences may take (llama-server's --cache-ram default is 8 GiB)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
