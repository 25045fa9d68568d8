"""The snapshot writer lets go of a job once it is written: a llama.cpp job holds the exported sequence state
(~65 MB at 3K tokens of the default model), resident for as long as the writer idles otherwise."""

from __future__ import annotations

import gc
import os
import sys
import weakref

import pytest

from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore
from zllm.kvcache.writer import WRITER_NICENESS, SnapshotWriter

TOKENS = tuple(range(300))


class StateBuffer(bytearray):
    """The exported bytes, in a type a weak reference can follow."""


def test_a_written_job_is_not_held_while_the_writer_waits(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "kv-llamacpp", "layout", 1 << 30)
    writer = SnapshotWriter(store)
    try:
        state = StateBuffer(os.urandom(100_000))
        alive = weakref.ref(state)
        export = (lambda view=memoryview(state): view)  # the job's export holds the bytes, as llama.cpp's does
        assert writer.submit(SnapshotJob("snap", "ns", "m", TOKENS, 300, 1, export))
        del export
        del state
        writer.flush()
        gc.collect()
        assert store.stats().snapshots == 1 and alive() is None, "written, then let go"
    finally:
        writer.close()
        store.close()


def test_the_writer_thread_yields_to_the_engine_thread(tmp_path) -> None:
    # the writer runs beside the next request's prefill: a higher nice value on its thread alone (Linux)
    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread nice values are Linux's")
    store = SnapshotStore(tmp_path / "kv", "layout", 1 << 30)
    writer = SnapshotWriter(store)
    try:
        writer.submit(SnapshotJob("snap", "ns", "m", TOKENS, 300, 1, lambda: b"x" * 1000))
        writer.flush()  # the thread has started and set its priority
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        theirs = os.getpriority(os.PRIO_PROCESS, writer._thread.native_id)
        assert theirs == min(mine + WRITER_NICENESS, 19) and os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        writer.close()
        store.close()
