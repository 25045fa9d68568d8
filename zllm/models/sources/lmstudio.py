"""A model from LM Studio's local store: `zllm pull lmstudio:publisher/repo[:QUANT]` (or `--file NAME.gguf`).

LM Studio keeps downloads as plain files, one folder per hub repository:

    ~/.lmstudio/models/<publisher>/<repo>/<file>.gguf       (current versions)
    ~/.cache/lm-studio/models/<publisher>/<repo>/...        (older versions)

LMSTUDIO_MODELS names the models folder instead. The file is picked like a hub repo's (gguf_pick.py) and
hard-linked into the zllm store (a symlink across file systems): no gigabytes copied. LM Studio does not
record digests, so the file is hashed once, here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.gguf_import import Placement, stage_gguf
from zllm.models.sources.gguf_pick import pick_gguf
from zllm.models.staging import Stage

PREFIX = "lmstudio:"


def lmstudio_models_dirs() -> list[Path]:
    """Where LM Studio keeps models, most likely first: LMSTUDIO_MODELS alone when it is set."""
    if override := os.environ.get("LMSTUDIO_MODELS"):
        return [Path(override).expanduser()]
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def parse_lmstudio_ref(text: str) -> tuple[str, str, str | None]:
    """`(publisher, repo, quant | None)` for `publisher/repo[:QUANT]`."""
    path, _, quant = text.partition(":")
    parts = path.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts) or ":" in quant:
        raise PullError(
            f"`{PREFIX}{text}` is not an LM Studio model",
            hint=f"use {PREFIX}PUBLISHER/REPO[:QUANT], the folders under LM Studio's models directory",
        )
    return parts[0], parts[1], quant or None


@dataclass(frozen=True)
class LmStudioSource:
    publisher: str
    repo: str
    quant: str | None = None
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{PREFIX}{self.publisher}/{self.repo}"

    @property
    def default_name(self) -> str:
        """`publisher/repo-Q4_K_M`; with --file, `publisher/<file stem>`."""
        publisher = name_from_path_stem(self.publisher)
        if self.file is not None:
            return f"{publisher}/{name_from_path_stem(Path(self.file).stem)}"
        return f"{publisher}/{name_from_path_stem(self.repo + (f'-{self.quant}' if self.quant else ''))}"

    def _folder(self) -> Path:
        roots = lmstudio_models_dirs()
        for root in roots:
            folder = root / self.publisher / self.repo
            if folder.is_dir():
                return folder
        raise PullError(
            f"LM Studio has no model {self.publisher}/{self.repo}",
            hint=f"looked in {', '.join(str(r) for r in roots)}; LMSTUDIO_MODELS names another models folder",
        )

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        folder = self._folder()
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.suffix.lower() == ".gguf"]
        file = pick_gguf(files, self.where, quant=self.quant, file=self.file)
        staged = stage_gguf(
            folder / file, stage, progress, placement=Placement.LINK_OR_SYMLINK, label=f"{self.where}/{file}"
        )
        return staged.fetched(f"{self.where}/{file}", {"gguf_file": file, "lmstudio_path": str(folder / file)})


def lmstudio_source(text: str, file: str | None = None) -> LmStudioSource:
    """The source for `lmstudio:PUBLISHER/REPO[:QUANT]` (text without the prefix)."""
    return LmStudioSource(*parse_lmstudio_ref(text), file=file)
