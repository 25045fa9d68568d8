"""Import a GGUF file (llama.cpp / Ollama / LM Studio) as a safetensors model directory.

transformers reads the GGUF (`from_pretrained(dir, gguf_file=...)`, both model and tokenizer), the
weights are dequantized, and `save_pretrained` writes an ordinary model directory with the tokenizer and
the chat template the GGUF carries (`tokenizer.chat_template`).

Stored in float32: dequantizing a Q4/Q8 block (fp16 scale × small int + fp16 offset) is exact in float32
but not in bfloat16 (8-bit mantissa). Storing float32 keeps the one rounding where it belongs, in the
engine's own cast to bf16 on a GPU, and keeps CPU serving (float32) bit-exact to the GGUF. It costs disk:
about 8x a Q4 file (SmolLM2-135M: 98 MB GGUF → 540 MB).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.files import sha256_file
from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.staging import Stage

IMPORT_DTYPE = "float32"


@dataclass(frozen=True)
class GgufHeader:
    architecture: str
    file_type: str
    has_chat_template: bool


def read_gguf_header(path: Path) -> GgufHeader:
    """The few metadata fields the import needs; PullError when the file is not a readable GGUF."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        architecture = str(reader.fields["general.architecture"].contents())
    except Exception as exc:  # gguf raises ValueError/KeyError/struct.error/IndexError on bad files
        raise PullError(f"`{path.name}` is not a readable GGUF file (truncated or corrupt?)") from exc
    file_type_field = reader.fields.get("general.file_type")
    file_type = "unknown"
    if file_type_field is not None:
        with contextlib.suppress(ValueError):
            # MOSTLY_Q4_1 → Q4_1, ALL_F32 → F32: the names llama.cpp users know
            file_type = gguf.LlamaFileType(file_type_field.contents()).name.removeprefix("MOSTLY_")
            file_type = file_type.removeprefix("ALL_")
    return GgufHeader(architecture, file_type, "tokenizer.chat_template" in reader.fields)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars and warnings: the pull reports progress through PullProgress."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # the GGUF dequantizer draws a plain tqdm bar that ignores the switch above
    plain_tqdm = getattr(gguf_utils, "tqdm", None)
    if plain_tqdm is not None:
        gguf_utils.tqdm = functools.partial(plain_tqdm, disable=True)
    try:
        yield
    finally:
        if plain_tqdm is not None:
            gguf_utils.tqdm = plain_tqdm
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _place_in_work_dir(gguf_path: Path, work: Path) -> Path:
    """transformers loads `gguf_file` from a directory: give it one holding only this file (a link)."""
    target_dir = work / "gguf"
    target_dir.mkdir(exist_ok=True)
    target = target_dir / gguf_path.name
    if target.resolve() == gguf_path.resolve():
        return target
    try:
        target.symlink_to(gguf_path.resolve())
    except OSError:  # no symlinks (Windows without privilege): a copy works everywhere
        shutil.copyfile(gguf_path, target)
    return target


def _load_tokenizer(gguf_file: Path):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    except Exception as exc:
        raise PullError(f"transformers could not read the tokenizer in `{gguf_file.name}`") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise PullError(
            f"`{gguf_file.name}` carries no chat template (tokenizer.chat_template)",
            hint="zllm builds every prompt with it; use an instruct/chat GGUF",
        )
    return tokenizer


def _load_dense_model(gguf_file: Path):
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_file.parent),
            gguf_file=gguf_file.name,
            dtype=getattr(torch, IMPORT_DTYPE),
            # unpack every block into plain tensors: the packed form cannot be saved as safetensors
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:
        raise PullError(f"transformers could not load the weights in `{gguf_file.name}`") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense now; drop the marker that blocks save_pretrained
        quantizer.remove_quantization_config(model)
    # configs built from GGUF metadata do not name the class; the store (and the engine) need it
    model.config.architectures = [type(model).__name__]
    return model


def import_gguf(
    gguf_path: Path, stage: Stage, progress: PullProgress, *, known_sha256: str | None = None
) -> dict[str, str]:
    """Write `gguf_path` as a safetensors model into `stage.model`; return facts for the manifest."""
    size = gguf_path.stat().st_size
    if known_sha256 is None:
        progress.stage(f"hashing {gguf_path.name}")
        label = f"hashing {gguf_path.name}"
        known_sha256 = sha256_file(gguf_path, lambda done: progress.transfer(label, done, size))
    header = read_gguf_header(gguf_path)
    if not header.has_chat_template:
        raise PullError(
            f"`{gguf_path.name}` carries no chat template (tokenizer.chat_template)",
            hint="zllm builds every prompt with it; use an instruct/chat GGUF",
        )
    gguf_file = _place_in_work_dir(gguf_path, stage.work)
    with quiet_transformers():
        progress.stage(f"converting the tokenizer ({header.architecture})")
        tokenizer = _load_tokenizer(gguf_file)
        progress.stage(f"dequantizing {header.file_type} weights to {IMPORT_DTYPE}")
        model = _load_dense_model(gguf_file)
        progress.stage("writing safetensors")
        model.save_pretrained(str(stage.model))
        tokenizer.save_pretrained(str(stage.model))
    return {
        "gguf_file": gguf_path.name,
        "gguf_sha256": known_sha256,
        "gguf_size_bytes": str(size),
        "gguf_architecture": header.architecture,
        "gguf_file_type": header.file_type,
    }


@dataclass(frozen=True)
class GgufFileSource:
    path: Path

    @property
    def default_name(self) -> str:
        return name_from_path_stem(self.path.stem)

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        origin = import_gguf(self.path, stage, progress)
        return Fetched(source=f"gguf:{self.path}", origin=origin)


def gguf_file_source(path: Path) -> GgufFileSource:
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise PullError(f"`{path}` is not a file")
    if os.path.getsize(resolved) == 0:
        raise PullError(f"`{path}` is empty")
    return GgufFileSource(resolved)
