"""Who owns a runtime dir and a data dir: `flock` locks held for the daemon's whole life.

    runtime_dir/zllm.pid        "4242\\n"   locked (LOCK_EX) by the running daemon
    data_dir/.daemon.lock       "4242\\n"   locked (LOCK_EX) by the daemon serving that store

A lock dies with its process, kill -9 included, so liveness is "can I take the lock?", never "does pid N
exist?" (pids are reused; a zombie still has one). A pid file nobody holds is stale: whoever finds it removes
it, together with the dead daemon's socket, while holding its lock so that a daemon starting at the same
moment cannot lose its fresh file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import ConfigError
from zllm.private_files import private_dir

DATA_DIR_LOCK = ".daemon.lock"


class DaemonAlreadyRunning(ConfigError):
    """Another daemon holds the runtime dir or the data dir."""

    code = "daemon_running"


@dataclass
class HeldLock:
    path: Path
    fd: int

    def release(self, *, remove: bool = False) -> None:
        if self.fd < 0:
            return
        if remove:  # while still holding the lock: nobody can have opened a newer file under this name
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def _try_lock(path: Path, *, retry_s: float = 0.0) -> HeldLock | None:
    """The lock on `path` (created if missing), or None when another process holds it. Retries for
    `retry_s` because a CLI probing liveness holds the lock for a moment."""
    deadline = time.monotonic() + retry_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
            continue
        if _same_file(fd, path):
            return HeldLock(path, fd)
        os.close(fd)  # removed (stale cleanup) between our open and our lock: take the new file


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)


def _write_pid(lock: HeldLock) -> None:
    os.ftruncate(lock.fd, 0)
    os.pwrite(lock.fd, f"{os.getpid()}\n".encode(), 0)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class DaemonLocks:
    """Held by a running daemon: its runtime dir (pid file) and its data dir."""

    def __init__(self, pid_lock: HeldLock, data_lock: HeldLock):
        self.pid_lock = pid_lock
        self.data_lock = data_lock

    @classmethod
    def acquire(cls, pid_file: Path, data_dir: Path, socket: Path) -> DaemonLocks:
        private_dir(pid_file.parent)  # the control socket's directory too: 0700 even where it existed wider
        data_dir.mkdir(parents=True, exist_ok=True)
        pid_lock = _try_lock(pid_file, retry_s=0.5)
        if pid_lock is None:
            raise DaemonAlreadyRunning(f"a zllm daemon (pid {read_pid(pid_file)}) is already running here "
                                       f"({pid_file.parent})", hint="stop it first: zllm stop")
        data_lock = _try_lock(data_dir / DATA_DIR_LOCK, retry_s=0.5)
        if data_lock is None:
            pid_lock.release(remove=True)
            raise DaemonAlreadyRunning(
                f"another zllm daemon (pid {read_pid(data_dir / DATA_DIR_LOCK)}) is using the data dir {data_dir}",
                hint="stop it first, or give this one its own --data-dir / ZLLM_DATA_DIR")
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()  # we hold the pid lock: any socket here belongs to a dead daemon
        _write_pid(pid_lock)
        _write_pid(data_lock)
        return cls(pid_lock, data_lock)

    def release(self) -> None:
        self.data_lock.release()
        self.pid_lock.release(remove=True)


@dataclass(frozen=True)
class PidState:
    """What the pid file says, as the CLI sees it."""

    pid: int | None
    alive: bool  # a process holds the lock
    stale: bool  # a pid file (or socket) was left by a dead daemon (and has been removed if asked)


def probe(pid_file: Path, socket: Path, *, clean: bool = True) -> PidState:
    """Is a daemon alive in this runtime dir? A stale pid file and socket are removed when `clean`."""
    if not pid_file.exists():
        stale_socket = socket.exists()  # a socket without a pid file: nothing can be serving it
        if stale_socket and clean:
            with contextlib.suppress(FileNotFoundError):
                socket.unlink()
        return PidState(None, False, stale_socket)
    pid = read_pid(pid_file)
    lock = _try_lock(pid_file)
    if lock is None:
        return PidState(pid, True, False)
    if clean:
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()
        lock.release(remove=True)
    else:
        lock.release()
    return PidState(pid, False, True)


def wait_until_released(pid_file: Path, timeout: float) -> bool:
    """True once no process holds the pid file's lock (the daemon exited), False after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_file.exists() or not probe_alive(pid_file):
            return True
        time.sleep(0.05)
    return False


def probe_alive(pid_file: Path) -> bool:
    try:
        fd = os.open(pid_file, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
