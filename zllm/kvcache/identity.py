"""Cache namespaces: everything that makes KV incompatible, folded into one key.

    model key  = H(weights identity, dtype, chat template hash)        one per served model configuration
    namespace  = H(model key, caller key)                               one per (model config, API key / salt)

The weights identity is the model store manifest's sha256 when the directory has one (`zllm-manifest.json`,
a hash over every file's sha256), else a hash of config.json's bytes and each weight file's name, size and
mtime (cheap, and changes whenever the weights do). One caller never matches another's cache: the caller
key is part of every lookup.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from zllm.model_files import MANIFEST_FILE

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


def weights_identity(model_dir: Path) -> str:
    model_dir = Path(model_dir)
    try:
        sha = json.loads((model_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("sha256")
        if isinstance(sha, str) and len(sha) == 64:
            return f"manifest:{sha}"
    except (OSError, ValueError, AttributeError):
        pass
    digest = hashlib.sha256()
    config = model_dir / "config.json"
    digest.update(config.read_bytes() if config.is_file() else b"")
    for path in sorted(p for p in model_dir.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        stat = path.stat()
        digest.update(f"\0{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return f"files:{digest.hexdigest()}"


def template_hash(chat_template: object) -> str:
    """A template may be one string or a dict of named templates; None hashes too (no template)."""
    text = json.dumps(chat_template, sort_keys=True) if not isinstance(chat_template, str) else chat_template
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_key(weights: str, dtype: str, template: str) -> str:
    return _hash("zllm-model", weights, dtype, template)


def request_namespace(model: str, caller: str) -> str:
    return _hash("zllm-namespace", model, caller)


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
