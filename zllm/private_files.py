"""Private files: what zllm keeps about a user's requests is readable by that user only, whatever the umask.

Conversations (the Responses store), KV snapshots (which decode back to prompts), the log and the control
socket all live under a handful of directories. Each of those directories is 0700 and each file 0600:

    private_dir(state_dir)                  # created 0700, or tightened to 0700 if it was wider
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)   # 0600 even when it existed as 0644
    tighten_tree(cache_dir / "kv")          # at start: everything an older zllm (or umask 000) left wider
    with private_umask():                   # around bind(): the socket is born 0600, no window before chmod
        ...

The daemon also runs under umask 077 (`set_private_umask`), so files its libraries create (sqlite's -wal
and -shm, snapshot temp files) are private without each call site knowing.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def set_private_umask() -> int:
    """Make every file and directory this process creates from now on private; returns the old umask."""
    return os.umask(PRIVATE_UMASK)


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """umask 077 for the block (bind() of a unix socket takes its mode from the umask, not an argument)."""
    old = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)


def private_dir(path: Path) -> Path:
    """`path` as a 0700 directory (its missing parents are made with the usual mode: they are not ours)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=DIR_MODE)
    _narrow(path, DIR_MODE)
    return path


def open_private(path: Path, flags: int) -> int:
    """os.open with O_CREAT at 0600, and an existing file narrowed to 0600 too; returns the fd."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_text(path: Path, text: str) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def tighten(path: Path) -> None:
    """Narrow an existing file to 0600 (a directory to 0700); a missing one is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        _narrow(path, DIR_MODE)
    elif stat.S_ISREG(mode) or stat.S_ISSOCK(mode):
        _narrow(path, FILE_MODE)


def tighten_tree(root: Path) -> None:
    """`root` and everything under it narrowed (directories 0700, files 0600); symlinks are not followed."""
    root = Path(root)
    if not root.is_dir() or root.is_symlink():
        tighten(root)
        return
    _narrow(root, DIR_MODE)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            tighten(Path(parent) / name)


def _narrow(path: Path, mode: int) -> None:
    """Set a path we own to exactly `mode` (another user's file, or a symlink, is left as it is)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        st = os.lstat(path)
        if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
