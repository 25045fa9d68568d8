"""The SSD tiers' one soundness check: an index row is trusted only once it agrees with its blob, at open and
again at every read. The one SSD store (snapshot_store.py) uses it.

    check = RowCheck(blobs_dir, ".zkv", chains=False, bytes_per_token=token_bytes)
    found = recover(index, check, quarantine_dir)   # at open: rows to trust, what was set aside, next generation
    reason = check(row, rows)                       # at read: None, or why the row is no longer trusted

A row is sound when its generation is an integer in [0, GENERATION_LIMIT); its blob is a regular file of exactly
the size the row records (the budget sums recorded sizes, so it counts only verified bytes); its token count is
within MAX_TOKENS and, where the tier knows its bytes per token, one the blob can hold; and its parent, if any,
is trusted, in the same namespace, and a prefix of it, with no loop. (A blob's contents are verified when read,
by each tier's format: checksums, token hash, layout.)

Nothing that fails is deleted silently: the row leaves the index, its blob goes to quarantine/ (set_aside.py),
the tier counts it (`quarantined`, shown by `zllm cache stats`) and the reason is logged once. Snapshots built on
it go with it (their KV starts with its tokens): their blobs are deleted, and the log line says how many.

Generations come from rows and blob file names, never without bounds. A file in blobs/ that is not named as
this tier names blobs, with a generation in range, is not ours (a stray): set aside and counted (`strays`), and
the next generation is one past the largest sound one, so a stray name cannot push writes past what sqlite holds.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
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
    """What a tier's index rows must agree with: its blob directory and naming, whether rows may chain."""

    blobs: Path
    suffix: str  # a blob is <16 hex digits of its generation><suffix>
    chains: bool = True  # the tensor tier stores a turn's new tokens on its parent's; llama.cpp's blobs are whole
    bytes_per_token: int = 0  # a blob holds at least this much per token of its own (0: the tier cannot say)

    def blob_name(self, generation: int) -> str:
        return f"{generation:0{NAME_DIGITS}x}{self.suffix}"

    def __call__(self, row: SnapshotRow, rows: Mapping[str, SnapshotRow], size: int | None = None) -> str | None:
        """Why `row` cannot be trusted, or None. `rows`: the trusted rows (its parent must be one); `size`: the
        blob's size when the caller has it open (else it is stat'ed)."""
        if not generation_sound(row.generation):
            return f"generation {row.generation!r} is out of bounds"
        if not (0 < row.own_length and row.length <= MAX_TOKENS):
            return f"token count {row.length} is out of bounds"
        return self._blob_problem(row, size) or self._parent_problem(row, rows)

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

    def _parent_problem(self, row: SnapshotRow, rows: Mapping[str, SnapshotRow]) -> str | None:
        if row.parent is None:
            return None
        if not self.chains:
            return f"names a parent ({row.parent}), and this tier writes none"
        parent = rows.get(row.parent)
        if parent is None or parent.namespace != row.namespace or row.parent_len > parent.length:
            return f"parent {row.parent} missing or incompatible"
        if row.tokens[:4 * row.parent_len] != parent.tokens[:4 * row.parent_len]:
            return f"tokens disagree with parent {row.parent}'s"
        if chain_loops(row, rows):
            return "parent chain loops"
        return None


def chain_loops(row: SnapshotRow, rows: Mapping[str, SnapshotRow]) -> bool:
    """True when following parents never ends (a forged index can make a cycle)."""
    for _ in range(len(rows) + 1):
        if row.parent is None or row.parent not in rows:
            return False
        row = rows[row.parent]
    return True


def descendants(rows: Mapping[str, SnapshotRow], row_id: str) -> list[str]:
    """Ids of the rows built on `row_id`, directly or not (cycles in a forged index are cut)."""
    children: dict[str, list[str]] = {}
    for row in rows.values():
        if row.parent is not None:
            children.setdefault(row.parent, []).append(row.id)
    out, seen, stack = [], {row_id}, list(children.get(row_id, []))
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        out.append(child)
        stack.extend(children.get(child, []))
    return out


@dataclass
class Recovered:
    """What `recover` found: the rows to trust and what it took out of service."""

    rows: dict[str, SnapshotRow]
    next_generation: int
    quarantined: int = 0  # rows set aside (with what was built on them), each logged with its reason
    strays: int = 0  # files in blobs/ that this tier did not name, set aside


def recover(index: SnapshotIndex, check: RowCheck, quarantine_dir: Path) -> Recovered:
    """Open-time sweep: drop malformed and unsound rows (their blobs set aside), set stray files aside, delete
    what a crash left half done (temps, blobs renamed but never indexed, blobs of rows built on a dropped one)."""
    rows, malformed = index.load()
    found = Recovered({row.id: row for row in rows}, 0)
    dropped, aside = [], set()  # ids out of the index; blob names kept for inspection
    for bad in malformed:
        _quarantined(found, aside, bad.id, bad.reason, bad.generation, 0, check)
        dropped.append(bad.id)
    for row in rows:  # a row dropped takes its descendants along, checked or not
        if row.id in found.rows and (reason := check(row, found.rows)) is not None:
            victims = [row.id, *descendants(found.rows, row.id)]
            for victim in victims:
                found.rows.pop(victim)
            _quarantined(found, aside, row.id, reason, row.generation, len(victims) - 1, check)
            dropped.extend(victims)
    if dropped:
        index.delete(dropped)
    found.next_generation = _sweep(found, aside, check, quarantine_dir) + 1
    return found


def _quarantined(found: Recovered, aside: set[str], row_id: str, reason: str, generation: object, built_on: int,
                 check: RowCheck) -> None:
    found.quarantined += 1
    if generation_sound(generation):
        aside.add(check.blob_name(generation))
    log.warning("kv cache: quarantined snapshot %s (%s)%s", row_id, reason,
                f" and {built_on} built on it" if built_on else "")


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
        else:  # a temp, a blob renamed but never indexed, a delete cut short, a blob built on a dropped row
            remove(path)
            largest = max(largest, generation)
    return largest
