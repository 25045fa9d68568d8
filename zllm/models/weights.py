"""Which weights a stored model holds: safetensors (the Hugging Face layout) or one GGUF file.

A GGUF model directory keeps the file as it was pulled, under a fixed name, next to the config and
tokenizer transformers read out of it (the loader hands `model.gguf` to llama.cpp, the rest to the
dialect detection and the prompt renderer):

    model.gguf                 the GGUF, byte for byte (a hard link, symlink or copy: manifest origin `gguf_link`)
    config.json                transformers' config read from the GGUF, with `architectures`; no weights
    tokenizer.json, tokenizer_config.json, chat_template.jinja, ...
    zllm-manifest.json         weights_format "gguf", quantization "Q4_K_M", dtype = quantization
"""

from __future__ import annotations

from pathlib import Path

from zllm.model_files import GGUF_FILE

SAFETENSORS = "safetensors"
GGUF = "gguf"


def gguf_weights(model_dir: Path) -> Path | None:
    """The model's GGUF file (symlinks resolved: llama.cpp gets the real file), or None for safetensors models."""
    path = Path(model_dir) / GGUF_FILE
    return path.resolve() if path.is_file() else None


def weights_format(model_dir: Path) -> str:
    """`"gguf"` when the directory holds model.gguf, else `"safetensors"`."""
    return GGUF if gguf_weights(model_dir) is not None else SAFETENSORS
