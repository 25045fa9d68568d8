"""`ModelLibrary`: the API layer's view of the model store (listing, pulling), injected like `EngineClient`.

The Ollama API lists the models on disk (`/api/tags`) and pulls new ones (`/api/pull`); the API layer may not
import the store itself, so the daemon hands it this (zllm/models/library.py implements it over `ModelStore`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LibraryModel:
    """A model in the store, as the Ollama listing shows it."""

    name: str
    size_bytes: int
    digest: str            # sha256 (hex) of the model's file listing
    modified_at: float     # unix seconds (when it was added)
    weights_format: str    # "safetensors" or "gguf"
    family: str            # the config's model_type ("qwen3", "llama"), "" when unknown
    quantization: str      # GGUF quantization ("Q4_K_M") or the weights' dtype ("bfloat16"), "" when unknown
    context_length: int | None  # the model's own window (the served window may be smaller)
    source: str            # where it was pulled from ("dir:/abs", "hf:org/name", ...)


class PullReporter(Protocol):
    """What a pull reports while it runs (called from the pulling thread)."""

    def stage(self, message: str) -> None: ...

    def transfer(self, label: str, done: int, total: int | None) -> None: ...


class ModelLibrary(Protocol):
    def list_models(self) -> list[LibraryModel]: ...

    def resolve(self, source: str) -> str:
        """The name `pull(source)` would store the model under; raises `ZllmError` (fast, no download) when
        `source` is nothing zllm can pull."""
        ...

    def pull(self, source: str, reporter: PullReporter) -> LibraryModel:
        """Fetch `source` into the store (blocking; idempotent). Raises `ZllmError` (`PullError`) on failure."""
        ...
