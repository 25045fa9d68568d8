"""What `zllm pull SOURCE` means, in this order:

    smollm2                 a built-in alias (aliases.py)
    ./model.Q4_K_M.gguf     an existing local GGUF file → GGUF import
    ./my-model/             an existing local directory → copied in
    org/name[@revision]     a Hugging Face hub repository

An existing local path wins over a hub id that happens to spell the same thing.
"""

from __future__ import annotations

from pathlib import Path

from zllm.errors import PullError
from zllm.models.aliases import ALIASES
from zllm.models.sources import Source
from zllm.models.sources.gguf_import import gguf_file_source
from zllm.models.sources.hub import HubSource, parse_hub_id
from zllm.models.sources.local_dir import local_dir_source


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text.endswith(".gguf") or "\\" in text


def resolve_source(text: str) -> Source:
    if text in ALIASES:
        return ALIASES[text]
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return gguf_file_source(path)
    if path.is_dir():
        return local_dir_source(path)
    if path.exists():
        raise PullError(f"`{text}` is neither a .gguf file nor a model directory")
    if _looks_like_path(text):
        raise PullError(f"no such file or directory: `{text}`")
    if hub_id := parse_hub_id(text):
        return HubSource(*hub_id)
    raise PullError(
        f"`{text}` is not a model zllm knows how to pull",
        hint=f"pull a hub repo (org/name or org/name@revision), a local .gguf file or model "
        f"directory, or one of: {', '.join(sorted(ALIASES))}",
    )
