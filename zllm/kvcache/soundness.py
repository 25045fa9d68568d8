"""The SSD store's soundness check: an index row is trusted only once it agrees with its blob, at open and
again at every read. The one SSD store (snapshot_store.py) uses it.

    check = RowCheck(blobs_dir, ".zkv", bytes_per_token=token_bytes)
    found = recover(index, check, quarantine_dir)   # at open: rows to trust, what was set aside, next generation
    reason = check(row)                             # at read: None, or why the row is no longer trusted

A row is sound when its generation is an integer in [0, GENERATION_LIMIT); its blob is a regular file of exactly
the size the row records (the budget sums recorded sizes, so it counts only verified bytes); its token count is
within MAX_TOKENS and, where the store knows its bytes per token, one the blob can hold; and it names no parent
(an older zllm chained a turn's blob onto its parent's; every snapshot is whole now). (A blob's contents are
verified when read, by the format: checksums, token hash, layout.)

Nothing that fails is deleted silently: the row leaves the index, its blob goes to quarantine/ (set_aside.py),
the store counts it (`quarantined`, shown by `zllm cache stats`) and the reason is logged once.

Generations come from rows and blob file names, never without bounds. A file in blobs/ that is not named as
this tier names blobs, with a generation in range, is not ours (a stray): set aside and counted (`strays`), and
the next generation is one past the largest sound one, so a stray name cannot push writes past what sqlite holds.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from zllm.kvcache.set_aside import remove, set_aside
from zllm.kvcache.ssd_index import MAX_TOKENS, SnapshotIndex, SnapshotRow

log = logging.getLogger("zllm.kvcache")

# sqlite's INTEGER holds up to 2**63 - 1 and a blob name has 16 hex digits (up to 2**64 - 1): a tier whose
# largest sound generation is just below this limit still has 2**62 writes left before either bound.
GENERATION_LIMIT = 1 << 62
NAME_DIGITS = 16
TEMP_SUFFIX = ".tmp"  # a write that never reached its rename (both tiers write <generation>.tmp first)


def generation_sound(generation: object) -> bool:
    return type(generation) is int and 0 <= generation < GENERATION_LIMIT


def generation_of(name: str, suffixes: tuple[str, ...]) -> int | None:
    """The generation a blob or temp file name stands for; None when it is not a name this tier writes or its
    generation is out of bounds (`ffffffffffffffff.zkv` included)."""
    stem, dot, suffix = name.partition(".")
    if not dot or f".{suffix}" not in suffixes or len(stem) != NAME_DIGITS or stem.strip("0123456789abcdef"):
        return None
    generation = int(stem, 16)
    return generation if generation_sound(generation) else None


@dataclass(frozen=True)
class RowCheck:
    """What the store's index rows must agree with: its blob directory and naming."""

    blobs: Path
    suffix: str  # a blob is <16 hex digits of its generation><suffix>
    bytes_per_token: int = 0  # a blob holds at least this much per token (0: the store cannot say)

    def blob_name(self, generation: int) -> str:
        return f"{generation:0{NAME_DIGITS}x}{self.suffix}"

    def __call__(self, row: SnapshotRow, size: int | None = None) -> str | None:
        """Why `row` cannot be trusted, or None. `size`: the blob's size when the caller has it open (else it is
        stat'ed)."""
        if not generation_sound(row.generation):
            return f"generation {row.generation!r} is out of bounds"
        if not (0 < row.own_length and row.length <= MAX_TOKENS):
            return f"token count {row.length} is out of bounds"
        if row.parent is not None:
            return f"names a parent ({row.parent}), and this store writes none"
        return self._blob_problem(row, size)

    def _blob_problem(self, row: SnapshotRow, size: int | None) -> str | None:
        if size is None:
            try:
                found = os.stat(self.blobs / self.blob_name(row.generation))
            except OSError:
                return "blob missing"
            if not stat.S_ISREG(found.st_mode):
                return "blob is not a file"
            size = found.st_size
        if size != row.nbytes:
            return f"blob is {size} bytes, the index says {row.nbytes}"
        if size < row.own_length * self.bytes_per_token:
            return f"a {size}-byte blob cannot hold {row.own_length} tokens"
        return None


@dataclass
class Recovered:
    """What `recover` found: the rows to trust and what it took out of service."""

    rows: dict[str, SnapshotRow]
    next_generation: int
    quarantined: int = 0  # rows set aside, each logged with its reason
    strays: int = 0  # files in blobs/ that this tier did not name, set aside


def recover(index: SnapshotIndex, check: RowCheck, quarantine_dir: Path) -> Recovered:
    """Open-time sweep: drop malformed and unsound rows (their blobs set aside), set stray files aside, delete
    what a crash left half done (temps, blobs renamed but never indexed, deletes cut short)."""
    rows, malformed = index.load()
    found = Recovered({row.id: row for row in rows}, 0)
    dropped, aside = [], set()  # ids out of the index; blob names kept for inspection
    for bad in malformed:
        _quarantined(found, aside, bad.id, bad.reason, bad.generation, check)
        dropped.append(bad.id)
    for row in rows:
        if (reason := check(row)) is not None:
            found.rows.pop(row.id)
            _quarantined(found, aside, row.id, reason, row.generation, check)
            dropped.append(row.id)
    if dropped:
        index.delete(dropped)
    found.next_generation = _sweep(found, aside, check, quarantine_dir) + 1
    return found


def _quarantined(found: Recovered, aside: set[str], row_id: str, reason: str, generation: object,
                 check: RowCheck) -> None:
    found.quarantined += 1
    if generation_sound(generation):
        aside.add(check.blob_name(generation))
    log.warning("kv cache: quarantined snapshot %s (%s)", row_id, reason)


def _sweep(found: Recovered, aside: set[str], check: RowCheck, quarantine_dir: Path) -> int:
    """Sort out the files in blobs/; returns the largest sound generation seen (-1: none)."""
    named = {check.blob_name(row.generation): row.generation for row in found.rows.values()}
    largest = max(named.values(), default=-1)
    for path in check.blobs.iterdir():
        if path.name in named:
            continue
        generation = generation_of(path.name, (check.suffix, TEMP_SUFFIX))
        if path.name in aside:
            set_aside(path, quarantine_dir)
        elif generation is None or path.is_dir() or path.is_symlink():
            found.strays += 1
            log.warning("kv cache: set aside blobs/%s: not a name this tier writes, or a generation out of range",
                        path.name)
            set_aside(path, quarantine_dir)
        else:  # a temp, a blob renamed but never indexed, a delete cut short
            remove(path)
            largest = max(largest, generation)
    return largest
