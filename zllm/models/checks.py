"""What makes a directory a servable model, checked before it may enter the store.

A model directory is the Hugging Face layout, safetensors only, or a GGUF kept as it is (weights.py):

    config.json                          with `architectures` (the class transformers builds)
    model.safetensors | model-0000N-of-0000M.safetensors + model.safetensors.index.json
    tokenizer.json | tokenizer.model | vocab.json+merges.txt, tokenizer_config.json, ...
    a chat template: chat_template.jinja | chat_template.json | tokenizer_config.json["chat_template"]

    or, for a GGUF: model.gguf (its header checked by gguf_header.check_gguf) instead of the safetensors

Pickle weights (.bin/.pth/.pt) are refused: loading them runs arbitrary code. Checks read headers and
small JSON files, never the weights themselves, except that the tokenizer is loaded for real (it is the
only way to know the chat template survives whatever form it is stored in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.gguf_header import check_gguf
from zllm.models.weights import GGUF, SAFETENSORS, gguf_weights

# the files a model needs; the same list filters hub downloads and local-directory copies
MODEL_FILE_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
)
PICKLE_SUFFIXES = (".bin", ".pth", ".pt", ".ckpt", ".pkl")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    model_type: str
    context_length: int | None
    dtype: str | None
    weights_format: str = SAFETENSORS
    quantization: str | None = None


def read_config(model_dir: Path, label: str) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise PullError(f"`{label}` has no config.json", hint="a model directory is what save_pretrained writes")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PullError(f"the config.json of `{label}` is not valid JSON") from exc
    if not isinstance(config, dict):
        raise PullError(f"the config.json of `{label}` is not a JSON object")
    return config


def architecture_of(config: dict, label: str) -> str:
    architectures = config.get("architectures")
    if not architectures or not isinstance(architectures, list) or not isinstance(architectures[0], str):
        raise PullError(
            f"the config.json of `{label}` does not name the model class (`architectures`)",
            hint='add e.g. "architectures": ["LlamaForCausalLM"], as save_pretrained writes it',
        )
    return architectures[0]


def context_length_of(config: dict) -> int | None:
    # multimodal configs keep the language model's settings under text_config
    for section in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def check_weights(model_dir: Path, label: str) -> None:
    """safetensors present and readable; pickle-only directories refused with a way out."""
    safetensors = sorted(model_dir.glob("*.safetensors"))
    if not safetensors:
        pickles = [p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise PullError(
                f"`{label}` holds only pickle weights ({', '.join(sorted(pickles)[:3])}), not safetensors",
                hint="zllm loads safetensors only (pickles can run code); convert once with "
                "`AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT)` and pull OUT",
            )
        raise PullError(
            f"`{label}` has no safetensors weights", hint="zllm loads *.safetensors only (pickles can run code)"
        )
    _check_shard_index(model_dir, label)
    for path in safetensors:
        _check_safetensors_header(path)


def _check_shard_index(model_dir: Path, label: str) -> None:
    for index in model_dir.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PullError(f"`{index.name}` of `{label}` is not a valid shard index") from exc
        missing = sorted(s for s in shards if not (model_dir / s).is_file())
        if missing:
            raise PullError(f"`{label}` misses weight shards: {', '.join(missing[:3])}")


def _check_safetensors_header(path: Path) -> None:
    """Parse the header; safetensors checks that the tensors it lists fit the file, so truncation shows."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as exc:  # safetensors raises its own SafetensorError, plus OSError
        raise PullError(f"`{path.name}` is not a readable safetensors file (truncated or corrupt?)") from exc


def check_config_loads(model_dir: Path, label: str) -> None:
    """transformers knows this model_type (a config it cannot build is a model zllm cannot serve)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # ValueError for an unknown model_type, KeyError/OSError for broken files
        raise PullError(
            f"transformers cannot load the config of `{label}`",
            hint="the model type may need a newer transformers, or custom code (which zllm does not run)",
        ) from exc


def check_tokenizer(model_dir: Path, label: str) -> None:
    """The tokenizer loads and carries a chat template: zllm renders every prompt through it."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # transformers raises many kinds here (OSError, ValueError, KeyError, ...)
        raise PullError(
            f"the tokenizer of `{label}` does not load",
            hint="a model directory needs tokenizer.json (or tokenizer.model) and tokenizer_config.json",
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise PullError(
            f"`{label}` has no chat template",
            hint="zllm builds every prompt with it; add chat_template.jinja (or pull the -Instruct variant)",
        )


def check_model_dir(model_dir: Path, label: str) -> ModelFacts:
    """Everything above; the facts the manifest records. Raises PullError naming what is wrong.

    `label` names the model in messages: the source the user typed, not the staging path it is checked in.
    """
    config = read_config(model_dir, label)
    architecture = architecture_of(config, label)
    gguf = gguf_weights(model_dir)
    quantization = check_gguf(gguf, label).file_type if gguf is not None else None
    if gguf is None:
        check_weights(model_dir, label)
    check_config_loads(model_dir, label)
    check_tokenizer(model_dir, label)
    dtype = quantization or config.get("dtype") or config.get("torch_dtype")
    return ModelFacts(
        architecture=architecture,
        model_type=str(config.get("model_type") or ""),
        context_length=context_length_of(config),
        dtype=str(dtype) if dtype else None,
        weights_format=GGUF if gguf is not None else SAFETENSORS,
        quantization=quantization,
    )
