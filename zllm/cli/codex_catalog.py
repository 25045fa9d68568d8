"""The catalog file `zllm codex` writes and points Codex's `model_catalog_json` at (Codex does not ask
`GET /v1/models` of a provider whose key comes from `env_key`, as `zllm codex` configures it); its entries are
built in zllm/codex_models.py, the same ones the daemon answers Codex's model discovery with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from zllm.codex_models import auto_compact_limit, codex_models

__all__ = ["auto_compact_limit", "write_catalog"]


def write_catalog(path: Path, model: str, context_length: int | None) -> Path:
    """Written whole or not at all (Codex may be reading the old one): a temporary file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(codex_models([(model, context_length)]), indent=2) + "\n")
    os.replace(partial, path)
    return path
