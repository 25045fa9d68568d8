"""A model store holding the tiny Qwen model in milliseconds: its files linked, a manifest written by hand.

`ModelStore.pull` would copy, hash and check the 56 MB model (seconds); inspection only needs the store to
find the directory and the manifest's context length.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_models import tiny_qwen_dir
from zllm.models.manifest import Manifest, write_manifest
from zllm.models.names import dir_name

TINY = "tiny-qwen"
TINY_WINDOW = 4096


def linked_store(data_dir: Path, name: str = TINY, context_length: int | None = TINY_WINDOW) -> Path:
    """`data_dir` (a ZLLM_DATA_DIR) whose store has the tiny model as `name`; returns data_dir."""
    model_dir = data_dir / "models" / dir_name(name)
    model_dir.mkdir(parents=True)
    for source in tiny_qwen_dir().iterdir():
        if source.is_file():
            (model_dir / source.name).symlink_to(source)
    write_manifest(model_dir, Manifest(name=name, source="dir:test", sha256="0" * 64, size_bytes=0,
                                       architecture="Qwen3ForCausalLM", added_at=0.0, context_length=context_length))
    return data_dir
