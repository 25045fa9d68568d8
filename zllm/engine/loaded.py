"""`LoadedModel`: the one backend object the runtime holds for a served model, whatever backend loaded it.

    loaded = load_for_backend(model_dir, ...)         # engine/select.py: torch/ or llamacpp/ builds one
    loaded.engine                                     the step-level engine seam (engine/contract.py)
    loaded.tokenizer, .context_length, .vocab_size    facts the prompt renderer and the stop rules read
    loaded.build_prefix_cache(config, ...)            its prefix cache (None: its KV cannot be cached)
    loaded.load_draft_model(path, ...)                a draft model for speculative decoding (ConfigError: none)
    loaded.free_speculation()                         whether speculation is exact and free here (--speculative auto)
    loaded.weights()                                  what `zllm ps` says of the weights
    loaded.out_of_memory(exc), loaded.close()

Each backend subclasses it in its own package (engine/torch/backend.py, engine/llamacpp/model.py), so nothing
above asks which backend it is. A request-level engine (a remote server that renders, samples and caches
itself) would be a different object beside this one, not a third copy of it: the runtime's loop drives only
step-level engines. Torch-free: nothing here imports an engine library.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from zllm.engine.contract import Engine
from zllm.errors import ConfigError
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.contract import KVPrefixCache


class Tokenizer(Protocol):
    """What zllm asks of a tokenizer: transformers' (torch backend) or prompt/tokenizer_files.TokenizerFiles."""

    chat_template: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], **options: Any) -> str: ...


class Drafter(Protocol):
    """One request's drafter (runtime/speculative.py's prompt lookup speaks the same interface)."""

    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, limit: int, tail: Sequence[int] = ()) -> list[int]: ...


class DraftModel(Protocol):
    """A draft model shared by every request: a fresh drafter per request."""

    def drafter_for(self, prompt_ids: Sequence[int]) -> Drafter: ...


@dataclass(frozen=True)
class Weights:
    """What `zllm ps` says of the loaded weights."""

    architecture: str
    parameters: int
    model_bytes: int


class LoadedModel(ABC):
    """A model ready for inference, with the facts the runtime needs about it. Subclasses are frozen dataclasses
    that hold these attributes (`dataclasses.replace` works on them)."""

    backend: ClassVar[str]  # the engine seam's backend that serves it: "torch", "llamacpp"
    path: Path
    tokenizer: Tokenizer
    # tokens that prompt + output must fit in (settings override, else the model's max_position_embeddings)
    context_length: int
    # intra-op threads the engine thread must use (0 = the engine library's default)
    threads: int
    backend_reason: str  # why this backend serves it (`zllm ps`, the startup log)
    device: Any  # where the weights run (str() names it: "cpu", "cuda:0")

    # the rest are a backend's fields or properties (a dataclass field cannot override an abstract property)
    engine: Engine  # the step-level engine over the weights (engine/contract.py)
    # transformers' config of the model, or config.json read as attributes (`architectures`, `get_text_config()`)
    config: Any
    quantization: str  # the weights' number format: a torch dtype's name, or the GGUF's quantization
    vocab_size: int  # rows of logits the engine returns (the fences' masks cover them)
    generation_eos: int | list[int] | None  # the generation config's EOS id(s), when the model has one

    @property
    def text_config(self) -> Any:
        return self.config.get_text_config()

    @property
    def cache_dtype(self) -> str:
        """The number format in the prefix cache's KV identity (runtime/prefix.served_model_key): two backends
        compute the same model's KV differently, so the backend's name is part of it."""
        return f"{self.backend}:{self.quantization}"

    @property
    def kv_cache_type(self) -> str:
        """The KV cells' number format when the backend chooses it apart from the weights' (llama.cpp's
        --cache-type: `zllm ps`, the startup log); "" when the KV cache keeps the model's dtype."""
        return ""

    @abstractmethod
    def device_cache_budget(self, budget_mb: int) -> int:
        """Bytes of KV the prefix cache's device tier may hold; `budget_mb` 0: the backend's default."""

    @abstractmethod
    def build_prefix_cache(self, config: CacheConfig, *, key: str, max_batch: int,
                           decode: Callable[[Sequence[int]], str]) -> KVPrefixCache[Any] | None:
        """The model's prefix cache (the seam in kvcache/contract.py), or None when its KV cannot be cached. `key`: the
        served model's KV identity; `decode`: token ids → text, for near-miss records."""

    def check_draft_model(self) -> None:
        """ConfigError when this backend cannot verify a draft model's proposals (the base: none can)."""
        raise ConfigError(f"--draft-model does not run on the {self.backend} backend",
                          hint="use --speculative on (prompt lookup), or the torch or llama.cpp backend")

    def load_draft_model(self, path: Path, *, dtype: str, threads: int) -> DraftModel:
        """A draft model for speculative decoding, on this model's device (ConfigError: none on this backend)."""
        self.check_draft_model()
        raise NotImplementedError

    def free_speculation(self) -> tuple[bool, str]:
        """Whether prompt-lookup speculation is exact here and costs nothing on a turn with nothing to copy (what
        `--speculative auto` turns on: engines.choose_speculation), and why. The base: no."""
        return False, f"the {self.backend} backend does not say that speculation costs nothing"

    @abstractmethod
    def weights(self) -> Weights: ...

    def out_of_memory(self, exc: BaseException) -> bool:
        """Whether `exc` says the device ran out of memory (and memory was given back to it)."""
        return False

    def close(self) -> None:
        """Give the weights and the engine's memory back (only once no thread runs the engine any more)."""


def window_length(config: Any, override: int) -> int:
    """`config`: a transformers config (or config.json as attributes); `override` > 0 wins."""
    native = getattr(config.get_text_config(), "max_position_embeddings", None)
    if override > 0:
        # a longer window than the model was trained for is allowed (RoPE scaling users know what they do)
        return override
    if not native:
        raise ConfigError("the model config has no max_position_embeddings", hint="set --context-length")
    return int(native)
