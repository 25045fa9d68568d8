"""A model directory on this machine (what `save_pretrained` writes), copied into the store.

Copied, not linked: the store owns its files, so editing or deleting the original later changes nothing.
Only the files a model needs are taken (checks.MODEL_FILE_PATTERNS, top level only).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.checks import MODEL_FILE_PATTERNS, architecture_of, check_weights, read_config
from zllm.models.files import copy_file
from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.staging import Stage


def is_model_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def model_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and is_model_file(p.name))


@dataclass(frozen=True)
class LocalDirSource:
    directory: Path

    @property
    def default_name(self) -> str:
        return name_from_path_stem(self.directory.name)

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        # refuse early (before copying gigabytes) what the store's full check would refuse anyway
        label = str(self.directory)
        architecture_of(read_config(self.directory, label), label)
        check_weights(self.directory, label)
        files = model_files(self.directory)
        total = sum(p.stat().st_size for p in files)
        progress.stage(f"copying {len(files)} files from {self.directory}")
        label = f"copying {self.directory.name}"
        copied = 0
        for path in files:

            def report(done: int, before: int = copied) -> None:
                progress.transfer(label, before + done, total)

            copy_file(path, stage.model / path.name, report)
            copied += path.stat().st_size
        progress.transfer(label, total, total)
        return Fetched(source=f"dir:{self.directory}")


def local_dir_source(path: Path) -> LocalDirSource:
    directory = path.expanduser().resolve()
    if not directory.is_dir():
        raise PullError(f"`{path}` is not a directory")
    return LocalDirSource(directory)
