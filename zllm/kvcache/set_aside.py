"""Moving damaged SSD-tier files out of service without deleting them: both tiers' quarantine.

    set_aside(blobs / "0000000000000007.zkv", quarantine_dir)   # file, directory or link alike

A set-aside entry gets a unique name (a later snapshot of the same generation, or an index set aside twice,
never overwrites the evidence) and only the newest `QUARANTINE_KEEP` are kept, so a disk that keeps failing
cannot fill itself with quarantine. When moving is impossible (another filesystem, a permission), the entry is
deleted instead: out of service matters more than kept for inspection.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger("zllm.kvcache")

QUARANTINE_KEEP = 16


def set_aside(path: Path, quarantine_dir: Path, keep: int = QUARANTINE_KEEP) -> bool:
    """Move `path` into `quarantine_dir`; False when there was nothing there."""
    if not path.exists() and not path.is_symlink():
        return False
    target = quarantine_dir / f"{path.name}.{time.time_ns()}"
    try:
        quarantine_dir.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    except OSError as exc:
        log.warning("kv cache: cannot move %s aside (%s); deleting it", path, exc)
        remove(path)
    _keep_newest(quarantine_dir, keep)
    return True


def remove(path: Path) -> None:
    """Delete a file, a link or a whole directory; never raises."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("kv cache: cannot delete %s (%s)", path, exc)


def _keep_newest(directory: Path, keep: int) -> None:
    try:
        entries = sorted(directory.iterdir(), key=_set_aside_at)
    except OSError:
        return
    for old in entries[:-keep] if keep else entries:
        remove(old)


def _set_aside_at(path: Path) -> int:
    """When `path` was set aside: its name's suffix (a move keeps the file's own mtime)."""
    suffix = path.name.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else path.lstat().st_mtime_ns
