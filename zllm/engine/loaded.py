"""`LoadedModel`: a model ready for inference and the facts the runtime needs about it, whatever backend loaded
it. Torch-free: the llama.cpp path builds one without importing torch (engine/torch/loader.py is torch's loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zllm.errors import ConfigError

# the GGUF a model directory holds (zllm/models/weights.py names the same file; engine/ cannot import models/)
GGUF_FILE = "model.gguf"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference, with the facts the runtime needs about it."""

    path: Path
    model: Any  # a transformers PreTrainedModel (None on llama.cpp, which holds the weights itself)
    tokenizer: Any  # a transformers tokenizer, or prompt/tokenizer_files.TokenizerFiles on llama.cpp
    device: Any  # the torch.device the model runs on; "cpu" on llama.cpp (its engine.device says numpy logits)
    dtype: Any  # a torch.dtype, or the GGUF's quantization name
    # tokens that prompt + output must fit in (settings override, else the model's max_position_embeddings)
    context_length: int
    # torch intra-op threads the engine thread must use (0 = torch's default)
    threads: int = 0
    # the engine seam's backend that serves it (engine/contract.py), why, and the weights' quantization
    backend: str = "torch"
    backend_reason: str = "safetensors weights run on transformers"
    # a backend built at load time (llama.cpp holds the weights itself; `model` is then None)
    engine: Any = None
    # transformers' config of the model (read from the GGUF for llama.cpp); None: model.config
    model_config: Any = None
    # the generation config's EOS id(s), when the model has one
    generation_eos: Any = None

    def __post_init__(self) -> None:
        assert self.context_length > 0, "context_length is resolved at load time"

    @property
    def config(self):
        return self.model_config if self.model_config is not None else self.model.config

    @property
    def text_config(self):
        return self.config.get_text_config()

    @property
    def quantization(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def _context_length(model, override: int) -> int:
    """`model`: a PreTrainedModel or its config."""
    config = getattr(model, "config", model)
    native = getattr(config.get_text_config(), "max_position_embeddings", None)
    if override > 0:
        # a longer window than the model was trained for is allowed (RoPE scaling users know what they do)
        return override
    if not native:
        raise ConfigError("the model config has no max_position_embeddings", hint="set --context-length")
    return int(native)
