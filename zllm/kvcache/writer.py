"""The snapshot writer thread: SSD writes happen here, never on the engine thread.

The engine thread hands over a `SnapshotJob` whose export reads only what the engine no longer mutates (torch:
the device tier's node spans, immutable once inserted, or a clone; llama.cpp: a copy of the state) and moves
on; the export itself (serialising tensors) runs here. The queue is bounded: when the disk
falls behind, new jobs are dropped (counted, logged at debug) rather than holding device memory hostage
or stalling generation; the device tier still has them, and the next turn will be written anyway.

A turn's snapshot is written while the next request (often a side request) already runs: on a machine with few
cores the write (checksums, the kernel's copy into the page cache, fsync) competes with the engine thread for a
core. So the writer runs at a lower CPU priority (Linux gives each thread its own nice value): it takes what the
engine thread leaves, and the SSD tier is still written within seconds of a turn.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from typing import Protocol


class SnapshotJob(Protocol):
    id: str


class SnapshotStore(Protocol):
    """What the writer asks of the SSD store (snapshot_store.py)."""

    def commit(self, job: SnapshotJob) -> None: ...

    def flush_touches(self) -> None: ...

log = logging.getLogger("zllm.kvcache")

QUEUE_LIMIT = 4
WRITER_NICENESS = 10  # added to the daemon's; the engine thread keeps the daemon's own
_STOP = object()


class SnapshotWriter:
    def __init__(self, store: SnapshotStore, *, threads: int = 1):
        self.store = store
        self.dropped = 0
        self.failed = 0
        self._threads = threads
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._main, name="zllm-kv-writer", daemon=True)
        self._thread.start()

    def submit(self, job: SnapshotJob) -> bool:
        try:
            self._queue.put_nowait(job)
            return True
        except queue.Full:
            self.dropped += 1
            log.debug("kv cache: writer queue full, snapshot %s not written", job.id)
            return False

    def full(self) -> bool:
        """True when a submit now would be dropped (callers skip preparing the job)."""
        return self._queue.full()

    def flush(self) -> None:
        """Block until every submitted job is written (tests, shutdown, benchmarks)."""
        self._queue.join()
        self.store.flush_touches()

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish queued writes (a daemon restart should find the last turn on disk), then stop."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _main(self) -> None:
        lower_thread_priority(WRITER_NICENESS)
        torch = sys.modules.get("torch")  # only a torch cache serializes tensors; never import torch for it
        if self._threads > 0 and torch is not None:
            torch.set_num_threads(self._threads)  # serializing tensors must not compete with the engine's cores
        while (job := self._queue.get()) is not _STOP:
            try:
                self.store.commit(job)
            except Exception:  # a full disk or a bad directory must not kill the writer or the daemon
                self.failed += 1
                log.exception("kv cache: writing snapshot %s failed", job.id)
            finally:
                # drop the job before waiting for the next one: it holds the state's bytes (a long llama.cpp
                # sequence's are tens of MB), resident for as long as the queue stays empty otherwise
                job = None
                self._queue.task_done()
        self._queue.task_done()


def lower_thread_priority(step: int) -> None:
    """The calling thread's nice value raised by `step` (Linux: per thread; elsewhere it may be the whole process's,
    so only Linux does it). Best effort: a writer at normal priority is only slower to yield."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + step, 19))
    except OSError as exc:
        log.debug("kv cache: writer priority unchanged (%s)", exc)
