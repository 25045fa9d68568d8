"""`PrefixCache`: the one prefix cache, over a backend's KV interface (kv_interface.py). Tiers, graph and
diagnostics behind it; the runtime sees only contract.py's seam.

    lease = cache.acquire(namespace, prompt, hint=..., max_new_tokens=..., describe_position=...)  # engine thread
    seq = engine.open(lease)       # the backend reads `lease.kv`: its running sequence, [0, cached_tokens) filled
    # prefill prompt[lease.cached_tokens:] (never empty), decode ...
    cache.finish(lease, sequence, state, entry_id=..., prompt_length=...)    # keep the terminal state
    # or cache.release(lease) when the state must not be kept (the request failed mid-forward)

Lookup order: the entry graph's longest prefix (entry_graph.py; an exact id / client key hint is verified against
it), shared into a new running sequence by the backend (torch runs the next turn in the kept working set, or copies
the spans into pooled buffers; llama.cpp shares the cells); then the SSD tier when it has a longer prefix and the measured estimate says reading beats
recomputing; else cold. A hit never covers the whole prompt: the last prompt token is always prefilled, because
its logits are what the first output token is sampled from.

Budget, in bytes: kept entries (each shared span once) plus what running sequences hold (`pool_bytes`). Evict
first, then admit; least recently used first, except each namespace's main conversation (retention.py); the entry
an acquire is about to share from goes last.

Thread safety: `acquire`/`finish`/`release`/`complete_ssd` run on the engine thread; `stats`, `entries`, `prune`
and `near_misses` from any thread (one lock guards the graph).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from zllm.cache_views import STORE_TIERS, CacheEntry, CacheStats, PruneCounts, Tier
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.entry_graph import Entry, EntryGraph, Lookup
from zllm.kvcache.kv_interface import KVSequences
from zllm.kvcache.retention import Newcomer, next_eviction
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore
from zllm.kvcache.ssd_index import SnapshotInvalid, unpack_tokens
from zllm.kvcache.tiers import BaseLease, CacheTiers, open_ssd_tier

log = logging.getLogger("zllm.kvcache")


@dataclass(eq=False)
class Lease(BaseLease):
    """A lease on the prefix cache: the backend's running sequence, holding [0, cached_tokens) already."""

    kv: Any = field(default=None, kw_only=True)  # what the backend's engine.open(lease) reads
    source: Entry | None = field(default=None, kw_only=True)  # the entry its prefix was shared from
    lineage: Entry | None = field(default=None, kw_only=True)  # the entry whose conversation this continues


class PrefixCache(CacheTiers):
    def __init__(self, config: CacheConfig, kv: KVSequences, *, cost_key: str, budget_bytes: int | None = None,
                 decode: Callable[[Sequence[int]], str] | None = None):
        """`budget_bytes`: the device budget when the backend's pool bounds it below the config's."""
        store, ssd_off = open_ssd_tier(partial(SnapshotStore, config.ssd_dir, kv.snapshot_layout,
                                               config.ssd_budget_bytes, token_bytes=kv.token_bytes)) \
            if config.ssd_dir else (None, None)
        super().__init__(config, store, cost_key, decode, ssd_off)
        self.kv = kv
        self.budget_bytes = config.device_budget_bytes if budget_bytes is None else budget_bytes
        self.graph = EntryGraph(max(config.rounds, 1), self._drop_kv)

    # ------------------------------------------------------------------ request lifecycle (engine thread)

    def acquire(self, namespace: str, prompt: Sequence[int], *, hint: str | None = None,
                max_new_tokens: int = 1, describe_position: Callable[[int], str] | None = None,
                request_id: str = "", defer: bool = False) -> Lease:
        """`describe_position(token_index) -> str` names the prompt segment a token is in; called only when
        this request is recorded as a near miss (near_miss.py), outside the cache lock.

        `defer`: do only what memory can answer here; an SSD read that pays is left in `lease.pending` (the
        caller runs `read_ssd` off the engine thread, then `complete_ssd`), the near-miss diagnosis in
        `lease.diagnose` (any thread)."""
        prompt = tuple(prompt)
        assert prompt, "a request has at least one prompt token"
        limit = len(prompt) - 1
        room = len(prompt) + min(max_new_tokens, self.config.decode_reserve_tokens)
        with self._lock:
            found = self.graph.lookup(namespace, prompt, hint)
            lease = self._open(namespace, prompt, hint, found, min(found.length, limit), room)
        try:
            lease.pending, diverged = self._plan_ssd(lease, limit)
            lease.diagnose = partial(self._note_near_miss, lease, found, diverged, describe_position, request_id)
            if not defer:
                if lease.pending is not None:
                    self.complete_ssd(lease, self._outcome(lease))
                self.diagnose(lease)
        except BaseException:  # the caller never sees this lease: give its sequence back now
            self.release(lease)
            raise
        with self._lock:
            self._count_acquired(len(prompt), lease)
            if lease.tier.on_device and lease.lineage is not None:  # a reuse of the conversation it continues
                self.graph.touch(lease.lineage)  # (not of an entry it shares a few header tokens with)
        return lease

    def read_ssd(self, lease: Lease) -> Any:
        """The disk part of a deferred SSD restore (any thread). Raises SnapshotInvalid (the snapshot quarantined)
        when a blob is bad."""
        assert lease.pending is not None, "nothing to read"
        started = time.perf_counter()
        read = self.store.read(lease.pending, lease.cached_tokens)  # a SnapshotRead
        lease.restore_s = time.perf_counter() - started
        return read

    def complete_ssd(self, lease: Lease, outcome: Any) -> None:
        """Engine thread, after `read_ssd` returned `outcome` or raised it: the lease now starts from the restored
        prefix, or from what the device tier gave when the snapshot was rejected (damaged, or refused by the
        engine)."""
        match, lease.pending = lease.pending, None
        if not isinstance(outcome, BaseException):
            started = time.perf_counter()
            try:
                payload, first, stored = outcome  # stored: a newer snapshot's length when it superseded the match's
                lease.kv = self.kv.load(lease.kv, payload, first, match.length, stored)
                nbytes = len(payload)
            except SnapshotInvalid as exc:  # the engine refused the payload: set aside like a damaged blob
                self.store.quarantine(match.row, str(exc))
                outcome = exc
            else:
                lease.restore_s += time.perf_counter() - started
                self._restored(lease, match, nbytes)
                return
        if not isinstance(outcome, SnapshotInvalid):
            raise outcome
        with self._lock:
            self.counters.ssd_rejected += 1
        lease.rejected = f"SSD snapshot {match.row.id} set aside: {outcome}"
        log.warning("kv cache: SSD snapshot %s rejected, prefilling instead: %s", match.row.id, outcome)

    def _outcome(self, lease: Lease) -> Any:
        try:
            return self.read_ssd(lease)
        except SnapshotInvalid as exc:
            return exc

    def admission_need(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Bytes a request's running sequence holds while it runs (the scheduler's unit of room)."""
        return self.kv.room_bytes(prompt_tokens + min(max_new_tokens, self.config.decode_reserve_tokens))

    def admission_room(self) -> int:
        """Bytes of the device budget not held by running requests (kept entries are evicted to make room)."""
        with self._lock:
            return self.budget_bytes - self.kv.reserved_bytes()

    def finish(self, lease: Lease, sequence: Sequence[int], state: Any, *, entry_id: str,
               prompt_length: int, hint_key: str | None = None, buffers: Any = None) -> bool:
        """Keep the terminal state: `state` holds KV for exactly `sequence` (prompt + the generated tokens that
        were fed forward). `buffers`: what the request ended with, if it outgrew the lease's room. Returns whether
        the device tier kept it."""
        sequence = tuple(sequence)
        # a hint that named an entry is a continuation id, not a client key worth remembering
        hint_key = hint_key or (lease.hint if lease.hint not in self.graph.entries else None)
        with self._lock:
            if lease.done:
                return False
            lease.done = True
            self.kv.end_reservation(lease.kv)
            entry = self._keep(lease, sequence, state, entry_id, prompt_length, hint_key)
            if entry is not None:
                self.counters.kept += 1
            else:
                self.counters.not_kept += 1
            self._submit_snapshot(lease, sequence, state, entry, entry_id, prompt_length, hint_key)
            self._end(lease, buffers, kept=entry is not None)
            if entry is not None:
                self._make_room(0)  # a spare sequence for the next row (llama.cpp's ids)
        return entry is not None and entry_id in self.graph.entries

    def release(self, lease: Lease, buffers: Any = None) -> None:
        """End a lease without keeping anything (the request failed; its KV may be inconsistent)."""
        with self._lock:
            if not lease.done:
                lease.done = True
                self.kv.end_reservation(lease.kv)
                self._end(lease, buffers, kept=False)

    # ------------------------------------------------------------------ any thread

    def stats(self) -> CacheStats:
        ssd = self._ssd_stats()  # under the SSD store's own lock, not this one
        with self._lock:
            held = self.kv.held_bytes()
            return CacheStats(
                device_bytes=held, device_budget_bytes=self.budget_bytes, pool_bytes=self.kv.pool_bytes(),
                pool_in_use_bytes=self.kv.reserved_bytes(), retained_bytes=held,
                entries=len(self.graph.entries),
                nodes=sum(len(root.subtree()) - 1 for root in self.graph.roots.values()),
                namespaces=len(self.graph.roots), **self._common_stats(), **ssd)

    def entries(self) -> list[CacheEntry]:
        """Everything cached, newest use first: device entries, then SSD snapshots."""
        with self._lock:
            device = [CacheEntry(tier=Tier.DEVICE, id=e.id, namespace=e.namespace, tokens=e.length,
                                 prompt_tokens=e.prompt_length, bytes=self.kv.exclusive_bytes(e.kv), round=e.round,
                                 hits=e.hits, created=e.created)
                      for e in sorted(self.graph.entries.values(), key=lambda e: e.last_used, reverse=True)]
        return device + self._ssd_entries()

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None, tiers: tuple[Tier, ...] = STORE_TIERS) -> PruneCounts:
        """Drop cached state by age and/or namespace, then least recently used down to `max_bytes` per tier."""
        device_freed, ssd_removed = 0, 0
        if Tier.DEVICE in tiers:
            with self._lock:
                before = self.kv.held_bytes()
                cutoff = time.time() - older_than_s if older_than_s is not None else None
                if older_than_s is not None or namespace is not None:
                    for entry in [e for e in self.graph.entries.values()
                                  if (namespace is None or e.namespace == namespace)
                                  and (cutoff is None or e.created <= cutoff)]:
                        self.graph.drop(entry)
                if max_bytes is not None:
                    for entry in sorted(self.graph.entries.values(), key=lambda e: e.last_used):
                        if self.kv.held_bytes() <= max_bytes:
                            break
                        self.graph.drop(entry)
                device_freed = before - self.kv.held_bytes()
        if Tier.SSD in tiers and self.store is not None:
            ssd_removed = len(self.store.prune(older_than_s=older_than_s, max_bytes=max_bytes, namespace=namespace))
        return PruneCounts(device_freed_bytes=device_freed, ssd_removed=ssd_removed)

    def check_integrity(self) -> None:
        with self._lock:
            self.graph.check_integrity()
            for entry in self.graph.entries.values():
                self.kv.check(entry.kv, entry.length)
            assert self.kv.held_bytes() + self.kv.pool_bytes() <= max(self.budget_bytes, self.kv.pool_bytes()), \
                "the budget holds"
        self.flush()
        if self.store is not None:
            self.store.check_integrity()

    def close(self) -> None:
        """After the engine thread stopped: finish SSD writes, give every entry's KV back."""
        self._close_tiers()
        with self._lock:
            for entry in list(self.graph.entries.values()):
                self.graph.drop(entry)
            self.kv.close()

    # ------------------------------------------------------------------ internals

    def _open(self, namespace: str, prompt: tuple[int, ...], hint: str | None, found: Lookup, length: int,
              room: int) -> Lease:
        """A lease on a running sequence with room for `room` tokens: evict first (the entry to share from last),
        then share the found prefix into it (or open an empty one). Once shared, the running sequence holds the prefix
        on its own (torch copied it or holds its kept working set; llama.cpp's cells stay while any sequence holds them): nothing pins the entry.
        Caller holds the lock."""
        source = found.source if length > 0 else None
        if source is not None:
            source.users += 1
        try:
            self._make_room(self.kv.bytes_to_open(room))
        finally:
            if source is not None:
                source.users -= 1
        if source is not None and source.id not in self.graph.entries:
            source, length = None, 0  # the budget took it: cold
        running = self.kv.share(source.kv, length, room) if source is not None else self.kv.open(room)
        lineage = found.best.entry if found.best is not None and found.best.continues else None
        tier = Tier.hit(Tier.DEVICE, found.hint_verified) if length else Tier.COLD
        return Lease(namespace, prompt, length, tier, kv=running, source=source, lineage=lineage,
                     round=lineage.round + 1 if lineage else 1, hint=hint)

    def _plan_ssd(self, lease: Lease, limit: int) -> tuple[Any, Any]:
        """(the SSD prefix worth reading instead of recomputing, if any; the best diverging snapshot, for the
        near-miss log). Memory only: the index is mirrored in RAM."""
        if self.store is None or lease.cached_tokens >= limit:
            return None, None
        match, diverged = self.store.lookup(lease.namespace, lease.prompt, lease.hint)
        if match is None or min(match.length, limit) <= lease.cached_tokens:
            return None, diverged
        match = replace(match, length=min(match.length, limit))
        if not self.cost.restore_pays(match.length - lease.cached_tokens,
                                      self.store.read_bytes(match, lease.cached_tokens)):
            with self._lock:
                self.counters.ssd_not_worth_it += 1
            return None, diverged
        return match, diverged

    def _restored(self, lease: Lease, match: Any, nbytes: int) -> None:
        self.cost.observe_restore(nbytes, lease.restore_s)
        gain = match.length - lease.cached_tokens
        lease.cached_tokens, lease.tier = match.length, Tier.hit(Tier.SSD, match.hinted)
        if lease.lineage is None and match.length >= match.row.prompt_len:
            lease.round = match.row.round + 1
        with self._lock:
            self.counters.ssd_hits += 1
            self.counters.cached_tokens += gain

    def _note_near_miss(self, lease: Lease, found: Lookup, diverged: Any,
                        describe: Callable[[int], str] | None, request_id: str) -> None:
        best, near = found.best, self.near_miss_log
        if best is not None and near.qualifies(best.matched, best.entry.length, len(lease.prompt)):
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=best.entry.id, tier=Tier.DEVICE,
                                          request=lease.prompt, entry=best.entry.tokens, shared=best.matched,
                                          prompt_length=best.entry.prompt_length, describe=describe,
                                          request_id=request_id)
        elif diverged is not None and near.qualifies(diverged.length, diverged.row.length, len(lease.prompt)):
            row = diverged.row
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=row.id, tier=Tier.SSD,
                                          request=lease.prompt, entry=unpack_tokens(row.tokens),
                                          shared=diverged.length, prompt_length=row.prompt_len, describe=describe,
                                          request_id=request_id)

    def _keep(self, lease: Lease, sequence: tuple[int, ...], state: Any, entry_id: str, prompt_length: int,
              hint_key: str | None) -> Entry | None:
        """Evict first, then admit; running sequences' pool counts against the budget. Caller holds the lock."""
        if self.config.rounds == 0 or not sequence or entry_id in self.graph.entries:
            return None
        new = self.kv.new_bytes(lease.namespace, sequence)
        if new + self.kv.pool_bytes() > self.budget_bytes:
            return None  # it could not fit even alone: evicting everything else would be for nothing
        if not self.kv.shares_prefixes:  # the newer sequence holds their cells too
            for entry in self.graph.prefixes_of(lease.namespace, sequence):
                self.graph.drop(entry)
            new = self.kv.new_bytes(lease.namespace, sequence)
        # a side request's state may not push out the namespace's main conversation (retention.py)
        self._make_room(new, Newcomer(lease.namespace, len(sequence), lease.round, self.graph.now()))
        if self.kv.held_bytes() + self.kv.pool_bytes() + new > self.budget_bytes:
            return None
        handle = self.kv.keep(lease.namespace, sequence, state, lease.kv, entry_id)
        return self.graph.insert(lease.namespace, sequence, handle, entry_id=entry_id, prompt_length=prompt_length,
                                 lineage=lease.lineage, hint_key=hint_key)

    def _submit_snapshot(self, lease: Lease, sequence: tuple[int, ...], state: Any, entry: Entry | None,
                         entry_id: str, prompt_length: int, hint_key: str | None) -> None:
        if self.writer is None or len(sequence) < self.config.ssd_min_tokens or self.writer.full():
            return
        export = self.kv.export(entry.kv if entry is not None else None, state, len(sequence))
        self.writer.submit(SnapshotJob(entry_id, lease.namespace, self.config.model, sequence, prompt_length,
                                       lease.round, export, hint_key))

    def _make_room(self, need: int, newcomer: Newcomer | None = None) -> None:
        """Evict entries until the kept entries, the running pool and `need` more bytes fit the budget (and the
        backend has a spare sequence): least recently used first, except each namespace's main conversation
        (retention.py); an entry being shared from (`users`) goes last. Caller holds the lock."""
        kv, entries = self.kv, self.graph.entries
        while entries and (kv.held_bytes() + kv.pool_bytes() + need > self.budget_bytes or kv.short_of_sequences()):
            candidates = [e for e in entries.values() if e.users == 0] or list(entries.values())
            eviction = next_eviction(candidates, entries.values(), self.graph.now(), newcomer)
            if eviction.spared is not None:
                self._spared(eviction)
            if eviction.victim is None:
                return
            self.graph.drop(eviction.victim)

    def _drop_kv(self, entry: Entry) -> None:
        self.kv.drop(entry.kv)

    def _end(self, lease: Lease, buffers: Any, *, kept: bool) -> None:
        self.kv.release(lease.kv, buffers, kept=kept)
