"""`CacheConfig`: the prefix cache's budgets and thresholds, shared by both caches (torch tensors and llama.cpp
sequences); torch-free, so the llama.cpp path can name it without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheConfig:
    device_budget_bytes: int
    rounds: int = 4  # newest rounds of a conversation kept resident; 0 = keep nothing
    ssd_dir: Path | None = None  # None = no SSD tier
    ssd_budget_bytes: int = 10 << 30
    ssd_min_tokens: int = 256  # shorter sequences are not worth a file
    decode_reserve_tokens: int = 4096  # decode growth reserved per request (beyond it, buffers grow)
    near_miss_min_tokens: int = 1024
    near_miss_fraction: float = 0.9
    # llama.cpp: host RAM for kept sequences parked out of the KV pool (engine/llamacpp/kv.py), like llama-server's
    # --cache-ram (at most a quarter of the machine's RAM); -1 = 8 GiB, 0 = none parked
    park_budget_bytes: int = -1
    model: str = ""  # model identity, recorded with SSD snapshots (prune by model)

    def __post_init__(self) -> None:
        assert self.device_budget_bytes >= 0 and self.rounds >= 0 and self.ssd_budget_bytes >= 0
        assert self.ssd_min_tokens >= 1 and self.decode_reserve_tokens >= 1 and 0 < self.near_miss_fraction <= 1
