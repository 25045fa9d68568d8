"""SSD tier housekeeping: recovery on open, quarantine, eviction to the size bound, prune, listing, integrity.

Mixed into `SnapshotStore` (ssd_tier.py), which owns the state these methods use. Deleting is always
"index row first, then file", so a crash in between leaves an orphan file (removed on the next open),
never a row pointing at nothing. A snapshot whose parent goes, goes too (its KV starts with the parent's).
"""

from __future__ import annotations

import logging
import sqlite3
import time

from zllm.cache_views import SsdStats
from zllm.engine.torch.cache.ssd_format import SnapshotInvalid, read_header
from zllm.kvcache.retention import next_eviction
from zllm.kvcache.row_index import RowTable
from zllm.kvcache.set_aside import remove, set_aside
from zllm.kvcache.soundness import RowCheck, descendants, recover
from zllm.kvcache.ssd_index import SnapshotRow

log = logging.getLogger("zllm.kvcache")


class Maintenance:
    # ------------------------------------------------------------------ open

    def _recover(self) -> None:
        """Trust only rows that agree with their blobs (soundness.py: the same check runs at every read)."""
        self.check = RowCheck(self.blobs, ".safetensors", chains=True, bytes_per_token=self.layout.bytes_per_token)
        found = recover(self.index, self.check, self.quarantine_dir)
        self.rows = RowTable(found.rows)  # indexed for the longest-prefix lookup
        self._next_generation = found.next_generation
        self.counters["quarantined"] += found.quarantined
        self.counters["strays"] = found.strays
        damaged, index_set_aside = self.counters["quarantined"], self.counters["index_set_aside"]
        if damaged or index_set_aside or found.strays:
            log.warning("kv cache: SSD tier opened with %d snapshots, %d set aside as damaged%s%s", len(self.rows),
                        damaged, f", {found.strays} stray files set aside" if found.strays else "",
                        ", the index set aside" if index_set_aside else "")

    # ------------------------------------------------------------------ removal

    def quarantine(self, row_id: str, reason: str) -> None:
        """Take a bad snapshot (and the snapshots built on it) out of service; keep its blob for inspection."""
        with self._lock:
            row = self.rows.get(row_id)
            if row is None:
                return
            victims = [row_id, *self._descendants(row_id)]
            try:
                self.index.delete(victims)
            except sqlite3.Error as exc:  # locked by another process, say: out of service in memory regardless;
                log.warning("kv cache: cannot drop quarantined rows from the index (%s)", exc)  # no blob next open
            removed = [self.rows.pop(v) for v in victims]
            self._touched.difference_update(victims)
            self.counters["quarantined"] += 1
        log.warning("kv cache: quarantined snapshot %s (%s) and %d built on it", row_id, reason, len(victims) - 1)
        set_aside(self.blobs / row.blob_name, self.quarantine_dir)
        for other in removed[1:]:
            remove(self.blobs / other.blob_name)

    def _remove(self, ids: list[str]) -> int:
        """Delete rows (index first, then files); returns bytes freed."""
        with self._lock:
            ids = [i for i in ids if i in self.rows]
            self.index.delete(ids)
            removed = [self.rows.pop(i) for i in ids]
            self._touched.difference_update(ids)
        for row in removed:
            remove(self.blobs / row.blob_name)
        return sum(row.nbytes for row in removed)

    def _descendants(self, row_id: str) -> list[str]:
        return descendants(self.rows, row_id)

    def evict_to_budget(self, budget: int | None = None) -> list[str]:
        """Delete leaf snapshots until the total fits, least recently used first except each namespace's main
        conversation (retention.py; its chain's inner rows are no leaves); returns their ids."""
        budget = self.budget_bytes if budget is None else budget
        evicted = []
        while True:
            with self._lock:
                if self.total_bytes <= budget:
                    break
                parents = {r.parent for r in self.rows.values() if r.parent is not None}
                leaves = [r for r in self.rows.values() if r.id not in parents and r.id not in self._pinned]
                victim = next_eviction(leaves, self.rows.values(), time.time()).victim
                if victim is None:
                    break
            self._remove([victim.id])
            evicted.append(victim.id)
        self.counters["evicted"] += len(evicted)
        return evicted

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None) -> list[str]:
        """Delete snapshots not used for `older_than_s` and/or of `namespace` (a snapshot goes only with all
        snapshots built on it), then LRU leaves until the total is at most `max_bytes`."""
        removed: list[str] = []
        if older_than_s is not None or namespace is not None:
            cutoff = time.time() - older_than_s if older_than_s is not None else None
            with self._lock:
                chosen = {r.id for r in self.rows.values()
                          if (namespace is None or r.namespace == namespace)
                          and (cutoff is None or r.last_used <= cutoff)}
                # keep a chosen snapshot if something not chosen is built on it
                victims = [i for i in chosen if set(self._descendants(i)) <= chosen and i not in self._pinned]
            self._remove(victims)
            removed.extend(victims)
        if max_bytes is not None:
            removed.extend(self.evict_to_budget(max_bytes))
        return removed

    # ------------------------------------------------------------------ reporting

    @property
    def total_bytes(self) -> int:
        return sum(row.nbytes for row in self.rows.values())

    def snapshots(self) -> list[SnapshotRow]:
        with self._lock:
            return sorted(self.rows.values(), key=lambda r: r.last_used, reverse=True)

    def stats(self) -> SsdStats:
        with self._lock:
            return SsdStats(snapshots=len(self.rows), bytes=self.total_bytes, budget_bytes=self.budget_bytes,
                            **self.counters)

    def flush_touches(self) -> None:
        with self._lock:
            updates = [(self.rows[i].last_used, self.rows[i].hits, i) for i in self._touched if i in self.rows]
            self._touched.clear()
            if updates:
                try:
                    self.index.touch(updates)
                except sqlite3.Error as exc:  # recency only: losing it must not fail a shutdown
                    log.warning("kv cache: cannot record snapshot use in the index (%s)", exc)

    def close(self) -> None:
        self.flush_touches()
        self.index.close()

    def check_integrity(self) -> None:
        """Index ⇔ disk: rows load back identical, every row's chain is sound and its blob validates, no
        temporary or orphan files, and the bytes add up."""
        with self._lock:
            rows, malformed = self.index.load()
            assert not malformed, f"malformed rows {malformed}"
            assert {r.id: r.generation for r in rows} == {r.id: r.generation for r in self.rows.values()}
            for row in self.rows.values():
                assert (reason := self.check(row, self.rows)) is None, f"{row.id}: {reason}"
                with open(self.blobs / row.blob_name, "rb") as f:
                    try:
                        read_header(f, row.nbytes, self.layout, row.own_length, row.own_token_sha256)
                    except SnapshotInvalid as exc:
                        raise AssertionError(f"{row.id}: {exc}") from exc
            names = sorted(p.name for p in self.blobs.iterdir())
            assert names == sorted(r.blob_name for r in self.rows.values()), "no temporary or orphan blobs"
            assert sum(r.nbytes for r in self.rows.values()) == sum(
                (self.blobs / n).stat().st_size for n in names), "bytes add up"

