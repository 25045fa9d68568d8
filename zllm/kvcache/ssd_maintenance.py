"""SSD tier housekeeping: recovery on open, quarantine, eviction to the size bound, prune, listing, integrity.

Mixed into `SnapshotStore` (ssd_tier.py), which owns the state these methods use. Deleting is always
"index row first, then file", so a crash in between leaves an orphan file (removed on the next open),
never a row pointing at nothing. A snapshot whose parent goes, goes too (its KV starts with the parent's).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from zllm.cache_views import SsdStats
from zllm.kvcache.row_index import RowTable
from zllm.kvcache.set_aside import remove, set_aside
from zllm.kvcache.ssd_format import SnapshotInvalid, read_header
from zllm.kvcache.ssd_index import SnapshotRow

log = logging.getLogger("zllm.kvcache")


class Maintenance:
    # ------------------------------------------------------------------ open

    def _recover(self) -> None:
        for tmp in self.blobs.glob("*.tmp"):  # a write that never reached its rename
            tmp.unlink(missing_ok=True)
        rows, malformed = self.index.load()
        if malformed:
            log.warning("kv cache: dropping %d malformed index rows", len(malformed))
            self.index.delete(malformed)
        self.rows = RowTable({row.id: row for row in rows})  # indexed for the longest-prefix lookup
        for row in rows:  # quarantining a parent takes its descendants along, checked or not
            if row.id in self.rows and (reason := self._unsound(row)) is not None:
                self.quarantine(row.id, reason)
        referenced = {row.blob_name for row in self.rows.values()}
        generations = [self.index.max_generation()]
        for path in self.blobs.iterdir():
            generations.append(_generation_of(path))
            if path.name not in referenced:  # renamed but never indexed, or a delete cut short
                set_aside(path, self.quarantine_dir) if path.is_dir() else remove(path)  # a directory is not ours
        self._next_generation = max(generations) + 1
        damaged, index_set_aside = self.counters["quarantined"], self.counters["index_set_aside"]
        if damaged or index_set_aside:
            log.warning("kv cache: SSD tier opened with %d snapshots, %d set aside as damaged%s", len(self.rows),
                        damaged, ", the index set aside" if index_set_aside else "")

    def _unsound(self, row: SnapshotRow) -> str | None:
        """Why `row` cannot be trusted structurally (blob contents are validated when read), or None."""
        path = self.blobs / row.blob_name
        try:
            size = path.stat().st_size
        except OSError:
            return "blob missing"
        if not path.is_file():
            return "blob is not a file"
        if size != row.nbytes:
            return f"blob is {size} bytes, index says {row.nbytes}"
        if row.parent is None:
            return None
        parent = self.rows.get(row.parent)
        if parent is None or parent.namespace != row.namespace or row.parent_len > parent.length:
            return "parent missing or incompatible"
        if row.tokens[:4 * row.parent_len] != parent.tokens[:4 * row.parent_len]:
            return "tokens disagree with the parent's"
        if self._chain_too_long(row):
            return "parent chain loops"
        return None

    def _chain_too_long(self, row: SnapshotRow) -> bool:
        """True when following parents never ends (a forged index can make a cycle)."""
        for _ in range(len(self.rows) + 1):
            if row.parent is None or row.parent not in self.rows:
                return False
            row = self.rows[row.parent]
        return True

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
        children: dict[str, list[str]] = {}
        for row in self.rows.values():
            if row.parent is not None:
                children.setdefault(row.parent, []).append(row.id)
        out, seen, stack = [], {row_id}, list(children.get(row_id, []))
        while stack:
            child = stack.pop()
            if child in seen:  # a forged index can make a cycle
                continue
            seen.add(child)
            out.append(child)
            stack.extend(children.get(child, []))
        return out

    def evict_to_budget(self, budget: int | None = None) -> list[str]:
        """Delete least recently used leaf snapshots until the total fits; returns their ids."""
        budget = self.budget_bytes if budget is None else budget
        evicted = []
        while True:
            with self._lock:
                if self.total_bytes <= budget:
                    break
                parents = {r.parent for r in self.rows.values() if r.parent is not None}
                leaves = [r for r in self.rows.values() if r.id not in parents and r.id not in self._pinned]
                if not leaves:
                    break
                victim = min(leaves, key=lambda r: (r.last_used, -r.nbytes))
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
                assert (reason := self._unsound(row)) is None, f"{row.id}: {reason}"
                with open(self.blobs / row.blob_name, "rb") as f:
                    try:
                        read_header(f, row.nbytes, self.layout, row.own_length, row.own_token_sha256)
                    except SnapshotInvalid as exc:
                        raise AssertionError(f"{row.id}: {exc}") from exc
            names = sorted(p.name for p in self.blobs.iterdir())
            assert names == sorted(r.blob_name for r in self.rows.values()), "no temporary or orphan blobs"
            assert sum(r.nbytes for r in self.rows.values()) == sum(
                (self.blobs / n).stat().st_size for n in names), "bytes add up"


def _generation_of(path: Path) -> int:
    try:
        return int(path.name.split(".")[0], 16)
    except ValueError:
        return -1
