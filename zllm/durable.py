"""fsync, one way for everything zllm keeps across a crash: the model store's pulls (models/files.py) and the
KV cache's SSD snapshots (kvcache/blob_commit.py) make a file's bytes, and the renames in a directory, durable.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path, *, best_effort: bool = False) -> None:
    """fsync a file or a directory (a directory's fsync makes renames and new entries in it durable); raises
    OSError as os.fsync does. `best_effort`: a filesystem that cannot (directories cannot be opened on Windows)
    or fails is not an error (the model store: a pull's files are hashed into the manifest, which readers
    check). The KV tiers want the error: their commit is undone when a step of it fails (blob_commit.py)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not best_effort:
            raise
    finally:
        os.close(fd)
