"""The snapshot writer lets go of a job once it is written: a llama.cpp job holds the exported sequence state
(~65 MB at 3K tokens of the default model), resident for as long as the writer idles otherwise."""

from __future__ import annotations

import gc
import os
import weakref

from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore
from zllm.kvcache.writer import SnapshotWriter

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
