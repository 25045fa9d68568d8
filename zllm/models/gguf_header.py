"""Reading and checking a GGUF file's header before it may enter the store.

Everything here reads the header only (gguf.GGUFReader memory-maps the file and touches no tensor data),
so a multi-GB file is checked in well under a second. A file is refused, with a PullError saying why, when:

    it does not start with the GGUF magic            (not a GGUF at all: a .bin renamed, an HTML error page)
    gguf cannot parse its header                     (corrupt, or cut off inside the header)
    a tensor the header declares ends past the file   (truncated: a download or copy that stopped early)
    it is split (`-00001-of-00003.gguf`)              (the other parts would have to travel with it)
    its architecture is unknown to llama.cpp          (the backend that serves GGUFs could not load it)
    ... or to transformers' GGUF reader               (zllm reads the config and tokenizer through it)
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError

GGUF_MAGIC = b"GGUF"
# general.* / tokenizer.* are sections of transformers' mapping, not architectures
_NOT_ARCHITECTURES = {"general", "tokenizer"}


@dataclass(frozen=True)
class GgufHeader:
    architecture: str
    # the quantization llama.cpp users know: "Q4_K_M", "Q4_1", "F16", ...
    file_type: str
    has_chat_template: bool
    # general.split.count; 1 for an ordinary file
    split_count: int
    size_bytes: int
    # where the last tensor's data ends; a file shorter than this is truncated
    data_end: int


def _file_type_name(value: int) -> str | None:
    """MOSTLY_Q4_1 → Q4_1, ALL_F32 → F32: the names llama.cpp prints."""
    import gguf

    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return None


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _dominant_tensor_type(reader) -> str:
    """For files without general.file_type: the tensor type holding the most bytes ("Q4_K", "F16", ...)."""
    by_bytes: Counter[str] = Counter()
    for tensor in reader.tensors:
        by_bytes[tensor.tensor_type.name] += int(tensor.n_bytes)
    return by_bytes.most_common(1)[0][0] if by_bytes else "unknown"


def read_gguf_header(path: Path, label: str | None = None) -> GgufHeader:
    """The header facts the store needs; PullError when `path` is not a whole, readable GGUF file."""
    import gguf

    label = label or path.name
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise PullError(
            f"`{label}` is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})",
            hint="pull a .gguf file as llama.cpp, Ollama or LM Studio write them",
        )
    try:
        reader = gguf.GGUFReader(str(path))
        architecture = str(_field(reader, "general.architecture"))
        data_end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=reader.data_offset)
    except Exception as exc:  # gguf raises ValueError/KeyError/struct.error/IndexError on bad files
        raise PullError(
            f"`{label}` is not a readable GGUF file (truncated or corrupt?)",
            hint="download or copy it again",
        ) from exc
    file_type = None
    with contextlib.suppress(Exception):
        file_type = _file_type_name(int(_field(reader, "general.file_type")))
    size = path.stat().st_size
    split_count = _field(reader, "split.count") or _field(reader, "general.split.count") or 1
    return GgufHeader(
        architecture=architecture,
        file_type=file_type or _dominant_tensor_type(reader),
        has_chat_template="tokenizer.chat_template" in reader.fields,
        split_count=int(split_count),
        size_bytes=size,
        data_end=data_end,
    )


@functools.cache
def llama_cpp_architectures() -> frozenset[str]:
    """The architectures llama.cpp knows, as the gguf package (llama.cpp's own gguf-py) lists them."""
    import gguf

    return frozenset(gguf.MODEL_ARCH_NAMES.values())


@functools.cache
def transformers_architectures() -> frozenset[str]:
    """The GGUF architectures transformers can read a config and tokenizer from."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return frozenset(GGUF_SUPPORTED_ARCHITECTURES) - _NOT_ARCHITECTURES


def _transformers_reads(architecture: str) -> bool:
    # transformers maps a few llama.cpp names onto its own (qwen2moe → qwen2_moe, gpt-oss → gpt_oss)
    known = transformers_architectures()
    return (
        architecture in known or architecture.replace("-", "_") in known or architecture.replace("moe", "_moe") in known
    )


def check_gguf(path: Path, label: str | None = None) -> GgufHeader:
    """read_gguf_header plus everything that makes a GGUF servable by zllm; PullError naming what is wrong."""
    label = label or path.name
    header = read_gguf_header(path, label)
    if header.size_bytes < header.data_end:
        raise PullError(
            f"`{label}` is truncated: its header declares {header.data_end} bytes of tensors, "
            f"the file has {header.size_bytes}",
            hint="the download or copy stopped early; fetch it again",
        )
    if header.split_count > 1:
        raise PullError(
            f"`{label}` is one part of a GGUF split into {header.split_count} files; split GGUFs are not supported yet",
            hint="merge the parts with llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf` and pull OUT.gguf",
        )
    if header.architecture not in llama_cpp_architectures():
        raise PullError(
            f"`{label}` has the architecture `{header.architecture}`, which llama.cpp does not know",
            hint="zllm serves GGUF files with llama.cpp; pull a safetensors version of the model instead",
        )
    if not _transformers_reads(header.architecture):
        raise PullError(
            f"transformers cannot read the tokenizer and config of `{label}` (architecture `{header.architecture}`)",
            hint="transformers' GGUF reader knows: "
            + ", ".join(sorted(transformers_architectures()))
            + "; pull a safetensors version of the model instead",
        )
    if not header.has_chat_template:
        raise PullError(
            f"`{label}` carries no chat template (tokenizer.chat_template)",
            hint="zllm builds every prompt with it; use an instruct/chat GGUF",
        )
    return header
