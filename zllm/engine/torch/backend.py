"""`TorchModel`: the torch backend's object for the runtime (engine/loaded.py) — a transformers model on torch,
its engine (runner.ModelRunner, built on first use), its prefix cache over per-layer tensors, its drafter.

Default device budget of the prefix cache: a fraction of the memory left after loading the model (GPU) or of
the RAM available (CPU).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from zllm.engine.loaded import LoadedModel, Weights
from zllm.engine.torch.cache.kv import TorchKV
from zllm.engine.torch.cache.state import KVLayout
from zllm.engine.torch.kv_layers import supports_working_buffers
from zllm.engine.torch.runner import ModelRunner
from zllm.errors import ConfigError
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.prefix_cache import PrefixCache

log = logging.getLogger("zllm.runtime")

MiB = 1 << 20
GPU_FREE_FRACTION = 0.5  # of the memory still free after the model loaded (activations need the rest)
CPU_AVAILABLE_FRACTION = 0.25  # of the RAM available at start (the machine is shared)


@dataclass(frozen=True, kw_only=True, eq=False)
class TorchModel(LoadedModel):
    backend: ClassVar[str] = "torch"
    path: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    context_length: int
    threads: int = 0
    backend_reason: str = "safetensors weights run on transformers"

    def __post_init__(self) -> None:
        assert self.context_length > 0, "context_length is resolved at load time"

    @cached_property
    def engine(self) -> ModelRunner:
        # built on first use, not at load: its packing probe switches the model's attention implementation,
        # which a caller running model.generate() itself never asked for
        return ModelRunner(self.model)

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def quantization(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def cache_dtype(self) -> str:
        return self.quantization  # the first backend's identities had no backend name: kept, so SSD tiers stay valid

    @property
    def vocab_size(self) -> int:
        return self.text_config.vocab_size

    @property
    def generation_eos(self) -> int | list[int] | None:
        return getattr(self.model.generation_config, "eos_token_id", None)

    def device_cache_budget(self, budget_mb: int) -> int:
        return budget_mb * MiB or default_device_budget(self.device)

    def build_prefix_cache(self, config: CacheConfig, *, key: str, max_batch: int,
                           decode: Callable[[Sequence[int]], str]) -> PrefixCache | None:
        """None when the model's KV is not plain full-attention per-layer tensors."""
        if not supports_working_buffers(self.engine.config):
            log.warning("prefix cache off: %s has sliding-window/linear-attention/shared KV layers",
                        type(self.model).__name__)
            return None
        with torch.inference_mode():
            layout = KVLayout.of(self.engine.probe_kv_state())
        cost_key = f"cost:{layout.key}:{torch.device(self.device).type}:{key}"
        cache = PrefixCache(config, TorchKV(layout, self.device), cost_key=cost_key, decode=decode)
        log.info("prefix cache: device budget %d MB, %d rounds, %d bytes/token%s", config.device_budget_bytes // MiB,
                 config.rounds, layout.bytes_per_token,
                 f", SSD tier {config.ssd_dir} ({config.ssd_budget_bytes // MiB} MB)" if config.ssd_dir else "")
        return cache

    def check_draft_model(self) -> None:
        """A draft model's proposals are verified like prompt lookup's: every torch model can."""

    def load_draft_model(self, path: Path, *, dtype: str, threads: int):
        from zllm.engine.torch.draft_model import load_draft_model  # draft_model.py imports this module

        if path.is_file():
            raise ConfigError(f"the draft model {path} is a GGUF file: torch drafts with a model directory",
                              hint="serve a GGUF model (the llama.cpp backend), or name a draft model in the store")
        return load_draft_model(path, self.tokenizer, device=str(self.device), dtype=dtype, threads=threads)

    def free_speculation(self) -> tuple[bool, str]:
        """No: a verify's k-row forward sums its products otherwise than a 1-token step (its logits are close,
        not equal: tests/unit/runtime/test_speculative.py allows 1e-5), so a near-tie may flip a greedy answer,
        and no cost gate measures its rows (ModelRunner.verify_row_cost): a turn with nothing to copy ran at
        0.96x plain (bench/speculative.py)."""
        return False, ("torch verifies drafts with other sums than 1-token steps (close, not bit-exact) and "
                       "drafts without a cost gate (0.96x on a turn with nothing to copy)")

    def weights(self) -> Weights:
        tensors = {id(t): t for t in itertools.chain(self.model.parameters(), self.model.buffers())}.values()
        architectures = getattr(self.config, "architectures", None)
        return Weights(architecture=(architectures or [type(self.model).__name__])[0],
                       parameters=sum(p.numel() for p in self.model.parameters()),
                       model_bytes=sum(t.numel() * t.element_size() for t in tensors))

    def out_of_memory(self, exc: BaseException) -> bool:
        if not isinstance(exc, torch.OutOfMemoryError):
            return False
        torch.cuda.empty_cache()
        return True


def default_device_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_FREE_FRACTION)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on Linux/macOS
        available = 8 << 30
    return int(available * CPU_AVAILABLE_FRACTION)
