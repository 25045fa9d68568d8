"""File plumbing shared by the store and the sources: hashing, durable copies, fsync.

Everything a pull writes is fsynced before the manifest is written and the staging directory is renamed
into place, so after a crash a model directory is either whole or absent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from zllm.durable import fsync_path

CHUNK = 1 << 20

# called with the bytes done so far
BytesDone = Callable[[int], None]


def sha256_file(path: Path, on_bytes: BytesDone | None = None) -> str:
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if on_bytes:
                on_bytes(done)
    return digest.hexdigest()


def listing_digest(files: dict[str, str]) -> str:
    """sha256 of the `sha256sum`-style listing of `files` (path → sha256): one stable id for a model."""
    listing = "".join(f"{sha}  {path}\n" for path, sha in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def regular_files(root: Path) -> list[Path]:
    """Every regular file under `root`, sorted; symlinks are followed (the hub's snapshots are symlinks)."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def copy_file(src: Path, dst: Path, on_bytes: BytesDone | None = None) -> None:
    """Copy `src` to `dst` in chunks, reporting bytes, and fsync the result."""
    done = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(CHUNK):
            fout.write(chunk)
            done += len(chunk)
            if on_bytes:
                on_bytes(done)
        fout.flush()
        os.fsync(fout.fileno())


def link_or_copy(src: Path, dst: Path, on_bytes: BytesDone | None = None) -> None:
    """Hard-link `src` (resolving symlinks) to `dst`, or copy it when they are on different file systems.

    Hard links keep a big hub download from taking its space twice (hub cache + store) and are safe here:
    neither side ever rewrites a file in place.
    """
    real = src.resolve()
    try:
        os.link(real, dst)
    except OSError:
        copy_file(real, dst, on_bytes)


def fsync_tree(root: Path) -> None:
    for path in regular_files(root):
        fsync_path(path, best_effort=True)
    for directory in sorted({p.parent for p in root.rglob("*")} | {root}):
        fsync_path(directory, best_effort=True)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
