"""One blob put under its index row, the SSD store's way (snapshot_store.py).

    1. write <gen>.tmp and fsync it
    2. rename it to its final name, fsync the directory (the rename is on disk)
    3. insert the index row, in one sqlite transaction: only now can a lookup see the snapshot

A crash (kill -9, power loss) at any instant leaves a temp or a file no row names; the next start removes it.
An exception is cleaned up here, at once: whatever step fails (disk full while writing, an fsync or rename
error, a row the index refuses or a commit that fails), both the temp and the final file are removed before
the error goes on. So a blob exists only while a row names it: never an orphan that `zllm cache stats` does not
count while it fills the disk until the next start.

The caller builds its index row, and so checks it (ssd_index.SnapshotRow), before calling: nothing is
written for a row the index would refuse.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from zllm.durable import fsync_path

log = logging.getLogger("zllm.kvcache")

Row = TypeVar("Row")


def commit_blob(temp: Path, final: Path, write: Callable[[Path], int], index: Callable[[int], Row | None],
                stage: Callable[[str], None] = lambda name: None) -> Row | None:
    """`write(temp)` writes and fsyncs the blob and returns its size; `index(size)` inserts the row and returns
    it, or None when the snapshot is not wanted after all (its blob is then removed too). `stage` is called
    after each step (the crash-safety test kills the process there)."""
    try:
        size = write(temp)
        stage("blob-written")
        os.replace(temp, final)
        stage("blob-renamed")
        fsync_path(final.parent)
        stage("dir-synced")
        row = index(size)
    except BaseException:
        _remove(temp, final)
        raise
    if row is None:
        _remove(temp, final)
    return row


def _remove(*paths: Path) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # the next start removes it (no row names it); the first error is what matters
            log.warning("kv cache: cannot remove %s after a failed write (%s)", path.name, exc)
