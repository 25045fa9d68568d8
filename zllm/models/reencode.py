"""Re-encode a quantized GGUF as F16: the same weights, served without llama.cpp's quantized kernels.

Why: on llama.cpp's CPU kernels a quantized matrix is multiplied with activations quantized to 8 bits, and
the default model (SmolLM2-135M-Instruct, shipped as Q4_1) is too small to survive that: greedy, "What is
the capital of France?" answers "L'Étoile, la Marseillaise, …" from the Q4_1 file (and from Q8_0), "The
capital of France is Paris." from these same weights stored as F16. Re-encoding dequantizes each quantized
tensor (exactly: the F16 values are the Q4_1 values, rounded once to half precision) and keeps every other
tensor and every metadata key as it was; only `general.file_type` changes.

Only the built-in default is re-encoded (aliases.py): a user's own GGUF is served as the user chose it.
Pure gguf-py and numpy (no engine): a 135M model takes a few seconds and ~0.6 GB of memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zllm.models.progress import PullProgress

# what the manifest's origin calls this conversion
REENCODING = "gguf-py dequantize → F16 (1-D tensors and unquantized ones kept as they are)"
# metadata the writer writes itself, or that this conversion changes
_WRITTEN_BY_WRITER = {"general.architecture", "general.file_type"}
# the block quantizations gguf-py dequantizes (and llama.cpp multiplies with 8-bit activations)
_QUANTIZED = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def reencode_as_f16(src: Path, dst: Path, progress: PullProgress) -> str:
    """Write `src`'s tensors to `dst` as F16 (quantized matrices dequantized), metadata copied; the file type
    `src` had ("Q4_1"), as llama.cpp names it.

    `dst` is scratch in the pull's staging directory: a failure halfway leaves nothing the store would keep.
    """
    import gguf

    reader = gguf.GGUFReader(str(src))
    architecture = reader.fields["general.architecture"].contents()
    file_type = reader.fields["general.file_type"].contents()
    writer = gguf.GGUFWriter(str(dst), architecture)
    _copy_metadata(reader, writer)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    label = "re-encoding as F16"
    total = sum(int(tensor.n_bytes) for tensor in reader.tensors)
    done = 0
    for tensor in reader.tensors:
        _add_tensor(writer, tensor, gguf)
        done += int(tensor.n_bytes)
        progress.transfer(label, done, total)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _copy_metadata(reader, writer) -> None:
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in _WRITTEN_BY_WRITER:
            continue  # the file header's own counts, and the keys written above
        main_type = gguf.GGUFValueType(field.types[0])
        sub_type = gguf.GGUFValueType(field.types[-1]) if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), main_type, sub_type=sub_type)


def _add_tensor(writer, tensor, gguf) -> None:
    """A quantized or F32 matrix as F16; vectors (norms) and F16 / other unquantized tensors as they were."""
    kind = tensor.tensor_type
    kept_as_is = len(tensor.shape) < 2 or kind == gguf.GGMLQuantizationType.F16 or (
        kind != gguf.GGMLQuantizationType.F32 and kind.name not in _QUANTIZED
    )
    if kept_as_is:
        plain = kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=None if plain else kind)
        return
    values = tensor.data if kind == gguf.GGMLQuantizationType.F32 else gguf.quants.dequantize(tensor.data, kind)
    writer.add_tensor(tensor.name, np.asarray(values, dtype=np.float32).astype(np.float16))
