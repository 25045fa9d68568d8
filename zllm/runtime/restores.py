"""Disk and diagnostics off the engine thread: SSD restores and near-miss diagnoses.

    restores.start(request, lease, read)     read = the cache's read_ssd; runs on the restore thread
    for request, lease, outcome in restores.ready(): ...   the engine thread completes each and starts its row
    restores.diagnose(job)                   a near-miss diagnosis (renders prompt segments) on its own thread

A request whose prefix is on SSD joins the batch when its read is done; the rows already running keep
stepping meanwhile, so no decoding row waits on disk or on template rendering. Reads run one at a time (they
share the cache's staging buffer and the disk); a finished read wakes the engine loop (`wake`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("zllm.runtime")


@dataclass(eq=False)
class PendingRestore:
    request: object
    lease: object
    admitted_at: float
    future: Future


class Restores:
    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="zllm-restore")
        self._diagnoses = ThreadPoolExecutor(1, thread_name_prefix="zllm-diagnose")
        self._pending: list[PendingRestore] = []

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, request, lease, read: Callable) -> None:
        future = self._reads.submit(read, lease)
        self._pending.append(PendingRestore(request, lease, time.perf_counter(), future))
        future.add_done_callback(lambda _: self._wake())

    def ready(self) -> list[tuple[object, object, float, object]]:
        """Finished reads, oldest first: (request, lease, admitted_at, bytes read or the exception raised)."""
        done = [p for p in self._pending if p.future.done()]
        self._pending = [p for p in self._pending if not p.future.done()]
        return [(p.request, p.lease, p.admitted_at, p.future.exception() or p.future.result()) for p in done]

    def diagnose(self, job: Callable[[], None]) -> None:
        self._diagnoses.submit(_logged, job)

    def close(self) -> None:
        self._reads.shutdown(wait=True)
        self._diagnoses.shutdown(wait=True)


def _logged(job: Callable[[], None]) -> None:
    try:
        job()
    except Exception:  # a diagnosis is a nicety: it must never take anything down
        log.exception("near-miss diagnosis failed")
