"""What `zllm pull SOURCE [--file NAME.gguf]` means, in this order:

    smollm2                      a built-in alias (aliases.py)
    ollama:qwen2.5-coder:7b      a model in Ollama's local store (sources/ollama.py)
    lmstudio:pub/repo[:QUANT]    a model in LM Studio's local store (sources/lmstudio.py)
    ./model.Q4_K_M.gguf          an existing local GGUF file, stored as it is
    ./my-model/                  an existing local directory → copied in
    org/name-GGUF:Q4_K_M         one GGUF of a hub repository (also: any repo with --file, or `...-GGUF` alone)
    org/name[@revision]          a Hugging Face hub repository (safetensors)

An existing local path wins over a hub id that happens to spell the same thing.
"""

from __future__ import annotations

from pathlib import Path

from zllm.errors import PullError
from zllm.models.aliases import ALIASES
from zllm.models.sources import Source, lmstudio, ollama
from zllm.models.sources.gguf_import import gguf_file_source
from zllm.models.sources.hub import HubSource, parse_hub_id
from zllm.models.sources.hub_gguf import HubGgufSource, is_gguf_repo_name, parse_hub_gguf_id
from zllm.models.sources.local_dir import local_dir_source


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text.endswith(".gguf") or "\\" in text


def resolve_source(text: str, file: str | None = None) -> Source:
    """The source for `text`; `file` (`--file`) names one GGUF in a hub repo or an LM Studio folder."""
    if text.startswith(lmstudio.PREFIX):
        return lmstudio.lmstudio_source(text.removeprefix(lmstudio.PREFIX), file)
    if text.startswith(ollama.PREFIX):
        source: Source = ollama.ollama_source(text.removeprefix(ollama.PREFIX))
    elif text in ALIASES:
        source = ALIASES[text]
    else:
        source = _resolve_path_or_hub(text, file)
    if file is not None and not isinstance(source, HubGgufSource):
        raise PullError(
            f"--file names a GGUF in a hub repo or an LM Studio folder, not in `{text}`",
            hint="pull the file by its path instead: zllm pull ./NAME.gguf",
        )
    return source


def _resolve_path_or_hub(text: str, file: str | None) -> Source:
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return gguf_file_source(path)
    if path.is_dir():
        return local_dir_source(path)
    if path.exists():
        raise PullError(f"`{text}` is neither a .gguf file nor a model directory")
    if _looks_like_path(text):
        raise PullError(f"no such file or directory: `{text}`")
    if (gguf_id := parse_hub_gguf_id(text)) and (gguf_id[2] or file or is_gguf_repo_name(gguf_id[0])):
        repo, revision, quant = gguf_id
        return HubGgufSource(repo, revision, quant, file)
    if hub_id := parse_hub_id(text):
        return HubSource(*hub_id)
    raise PullError(
        f"`{text}` is not a model zllm knows how to pull",
        hint=f"pull a hub repo (org/name, org/name@revision, org/name-GGUF:QUANT), a local .gguf file or model "
        f"directory, ollama:MODEL[:TAG], lmstudio:PUBLISHER/REPO[:QUANT], or one of: {', '.join(sorted(ALIASES))}",
    )
