"""The staging area: where a pull builds a model before it appears in the store.

    models/
      .lock                      held (flock) for the few renames that commit or remove a model
      .staging/<token>/lock      held (flock) by the live process that owns this staging directory
      .staging/<token>/model/    the model being built; renamed to models/<dir_name> once whole
      .staging/<token>/work/     scratch for the source (downloaded wheel, GGUF link, ...)
      .staging/<token>/replaced  during `--force`: the old model, moved aside, then deleted
      .staging/<token>/removed   during `rm`: the model, moved out of sight, then deleted

A staging directory whose lock nobody holds belongs to a dead process (crash, SIGKILL, power loss) and is
deleted when a store is opened — unless it holds a `replaced` model whose name has no model any more (the
process died between the two renames of a swap), which is moved back first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zllm.durable import fsync_path
from zllm.models.files import remove_tree
from zllm.models.manifest import read_manifest
from zllm.models.names import dir_name

try:
    import fcntl
except ImportError:  # Windows: no flock; fall back to the age of the directory
    fcntl = None  # type: ignore[assignment]

STAGING_DIR = ".staging"
STORE_LOCK = ".lock"
# without flock, a staging directory this old is presumed abandoned
_STALE_AFTER_S = 24 * 3600


@dataclass(frozen=True)
class Stage:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def replaced(self) -> Path:
        return self.root / "replaced"

    @property
    def removed(self) -> Path:
        return self.root / "removed"


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the duration."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


class StagingArea:
    def __init__(self, models_dir: Path):
        self.models_dir = models_dir
        self.root = models_dir / STAGING_DIR

    @contextlib.contextmanager
    def new(self) -> Iterator[Stage]:
        """A fresh staging directory, locked by this process and deleted on exit whatever happens."""
        stage = Stage(self.root / secrets.token_hex(8))
        stage.work.mkdir(parents=True)
        stage.model.mkdir()
        fd = os.open(stage.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _try_lock(fd)
            yield stage
        finally:
            # delete before unlocking, so a concurrent cleaner never sees it unowned and half deleted
            remove_tree(stage.root)
            os.close(fd)

    def clean_stale(self) -> None:
        """Delete staging directories left by dead processes; restore a model orphaned mid-swap."""
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.root.iterdir()):
            self._clean_if_abandoned(entry)

    def _clean_if_abandoned(self, entry: Path) -> None:
        if not entry.is_dir():
            entry.unlink(missing_ok=True)
            return
        lock_path = entry / "lock"
        if not lock_path.exists():
            remove_tree(entry)  # died before taking the lock
            return
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except OSError:
            return
        try:
            abandoned = _try_lock(fd) if fcntl is not None else _older_than(entry, _STALE_AFTER_S)
            if abandoned:
                self._restore_orphan(Stage(entry))
                remove_tree(entry)
        finally:
            os.close(fd)

    def _restore_orphan(self, stage: Stage) -> None:
        """Move a model set aside by an interrupted swap back, if its name is now empty."""
        try:
            name = read_manifest(stage.replaced).name
        except (OSError, ValueError, TypeError):
            return
        target = self.models_dir / dir_name(name)
        with locked(self.models_dir / STORE_LOCK):
            if not target.exists():
                os.rename(stage.replaced, target)
                fsync_path(self.models_dir, best_effort=True)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False
