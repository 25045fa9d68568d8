"""Picking one GGUF out of a repository that holds many quantizations (hub repos, LM Studio folders).

A repo like `bartowski/Qwen2.5-7B-Instruct-GGUF` holds one file per quantization:

    Qwen2.5-7B-Instruct-Q4_K_M.gguf    Qwen2.5-7B-Instruct.Q8_0.gguf    Qwen2.5-7B-Instruct-IQ4_XS.gguf
    Qwen2.5-72B-Instruct-Q4_K_M-00001-of-00002.gguf (split)    mmproj-model-f16.gguf (a vision projector)

`SOURCE:Q4_K_M` picks the file whose name ends in that tag (case-insensitive, after `-`, `.` or `_`);
`--file NAME.gguf` names one exactly. Anything ambiguous is refused with the choices in the hint, never
guessed: two files that both claim Q4_K_M may be different models.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from zllm.errors import PullError

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$", re.IGNORECASE)
# the tail of a file name that names its quantization: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, UD-Q4_K_XL, MXFP4_MOE
_QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|B?F\d+|MXFP\d+(?:_MOE)?|TQ\d_\d))$", re.IGNORECASE)


def _stem(path: str) -> str:
    return PurePosixPath(path).name[: -len(".gguf")]


def is_split(path: str) -> bool:
    return _SPLIT.search(_stem(path)) is not None


def quant_of(path: str) -> str | None:
    """`name-Q4_K_M.gguf` → "Q4_K_M" (split suffixes ignored); None when the name does not say."""
    match = _QUANT.search(_SPLIT.sub("", _stem(path)))
    return match[1].upper() if match else None


def gguf_candidates(paths: list[str]) -> list[str]:
    """The model GGUFs among `paths`: vision projectors (mmproj-*) are companions, not models."""
    return sorted(
        p for p in paths if p.lower().endswith(".gguf") and not PurePosixPath(p).name.lower().startswith("mmproj")
    )


def _available(candidates: list[str]) -> str:
    quants = sorted({quant_of(p) or PurePosixPath(p).name for p in candidates})
    return ", ".join(quants)


def _refuse_split(path: str, where: str) -> None:
    if is_split(path):
        raise PullError(
            f"`{PurePosixPath(path).name}` in {where} is one part of a split GGUF; split GGUFs are not supported yet",
            hint="pick a quantization that comes as one file, or merge the parts with llama.cpp's "
            "`llama-gguf-split --merge` and pull the merged file",
        )


def _matches(path: str, quant: str) -> bool:
    stem = _SPLIT.sub("", _stem(path)).lower()
    tag = quant.lower()
    return stem == tag or any(stem.endswith(sep + tag) for sep in "-._")


def pick_gguf(paths: list[str], where: str, *, quant: str | None = None, file: str | None = None) -> str:
    """The one GGUF in `paths` that `quant` or `file` names (or the only one); PullError listing the choices.

    `where` names the repository in messages ("org/name-GGUF", "lmstudio:pub/repo"); it is also what the
    hint tells the user to type, followed by `:QUANT`.
    """
    candidates = gguf_candidates(paths)
    if not candidates:
        raise PullError(f"{where} holds no GGUF files", hint="pull a repository with .gguf files")
    if file is not None:
        exact = [p for p in candidates if p == file or PurePosixPath(p).name == file]
        if len(exact) != 1:
            names = ", ".join(PurePosixPath(p).name for p in candidates)
            raise PullError(f"{where} has no GGUF file `{file}`" if not exact else f"`{file}` is ambiguous in {where}",
                            hint=f"the GGUF files there: {names}")  # fmt: skip
        _refuse_split(exact[0], where)
        return exact[0]
    if quant is None:
        if len(candidates) == 1:
            _refuse_split(candidates[0], where)
            return candidates[0]
        raise PullError(
            f"{where} holds {len(candidates)} GGUF files; say which quantization",
            hint=f"pull {where}:QUANT, one of: {_available(candidates)} (or name a file with --file)",
        )
    matches = [p for p in candidates if _matches(p, quant)]
    if not matches:
        raise PullError(f"{where} has no {quant} GGUF", hint=f"the quantizations there: {_available(candidates)}")
    for path in matches:
        _refuse_split(path, where)
    if len(matches) > 1:
        raise PullError(
            f"{len(matches)} GGUF files in {where} match {quant}",
            hint="name one with --file: " + ", ".join(PurePosixPath(p).name for p in matches),
        )
    return matches[0]
