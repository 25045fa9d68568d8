"""`SequencePrefixCache`: the prefix cache for engines that hold KV themselves (llama.cpp's unified pool).

The torch backend's cache (prefix_cache.py) owns tensors: spans in a radix tree, copied into working buffers.
Here the engine owns every cell, and an entry IS a kept sequence in the engine's pool:

    lease = cache.acquire(namespace, prompt, ...)   # device hit: engine.share(entry, n) — the new sequence
                                                    # shares the entry's first n cells (no copy); SSD hit:
                                                    # engine.import_state(verified blob), cropped to n; else cold
    # prefill prompt[lease.cached_tokens:] into lease.sequence, decode ...
    cache.finish(lease, tokens, sequence, ...)      # the sequence becomes an entry; its state goes to SSD
    cache.release(lease)                            # the request failed: the sequence is given back

Budget, in tokens of the pool (`cells`): running requests reserve prompt + decode growth, entries count their
whole length (cells shared between an entry and a row are counted twice, so the estimate never undercounts);
least recently used entries are evicted to admit a request, each namespace's main conversation last
(retention.py). An entry whose tokens are a prefix of a newer entry's is dropped when the newer one is kept:
the newer sequence holds those cells too.

The runtime-facing surface (acquire / finish / release / admission_need / admission_room / observe_prefill /
stats / entries / prune / near_misses / flush / check_integrity / close) is PrefixCache's, so the engine loop and the control
methods use either. Engine thread for the lifecycle; stats, entries, prune and near_misses from any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from zllm.cache_views import STORE_TIERS, CacheEntry, CacheStats, PruneCounts, Tier
from zllm.diagnosis.near_miss import NearMiss
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.retention import next_eviction
from zllm.kvcache.sequence_snapshots import SequenceJob, SequenceMatch, SequenceSnapshots
from zllm.kvcache.ssd_index import SnapshotInvalid, unpack_tokens
from zllm.kvcache.tiers import BaseLease, CacheTiers, open_ssd_tier
from zllm.kvcache.token_prefix import common_prefix_length

log = logging.getLogger("zllm.kvcache")


class SequenceEngine(Protocol):
    """What this cache asks of the engine (LlamaCppEngine fills it)."""

    free_sequences: int

    def open(self, lease: Any = None) -> Any: ...

    def share(self, source: Any, length: int) -> Any: ...

    def crop(self, seq: Any, length: int) -> None: ...

    def release(self, seq: Any) -> None: ...

    def export_state(self, seq: Any) -> bytes: ...

    def import_state(self, data: bytes, length: int) -> Any: ...

    def length(self, seq: Any) -> int: ...


@dataclass(eq=False)
class SequenceEntry:
    id: str
    namespace: str
    tokens: tuple[int, ...]
    seq: Any
    prompt_length: int
    round: int
    hint_key: str | None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    hits: int = 0

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(eq=False)
class SequenceLease(BaseLease):
    """A lease on the llama.cpp cache: the engine's sequence, holding [0, cached_tokens) already."""

    sequence: Any = field(kw_only=True)
    reserved: int = field(kw_only=True)  # pool tokens reserved for this request while it runs


class SequencePrefixCache(CacheTiers):
    def __init__(self, config: CacheConfig, engine: SequenceEngine, *, cells: int, bytes_per_token: int,
                 layout: str, spare_sequences: int = 9, decode: Callable[[Sequence[int]], str] | None = None):
        """`layout` names what makes a saved state loadable (model, backend, KV types); `spare_sequences` are
        kept free for rows about to start (the batch size plus one)."""
        store, ssd_off = open_ssd_tier(partial(SequenceSnapshots, config.ssd_dir, layout, config.ssd_budget_bytes)) \
            if config.ssd_dir else (None, None)
        super().__init__(config, store, f"cost:seq:{layout}", decode, ssd_off)
        self.engine = engine
        # the config's device budget holds here as on the torch cache; the engine's pool is its upper bound
        self.cells = min(cells, config.device_budget_bytes // max(bytes_per_token, 1))
        self.bytes_per_token = bytes_per_token
        self.spare_sequences = spare_sequences
        self.entries_by_id: dict[str, SequenceEntry] = {}
        self.reserved = 0
        self._pending_release: list[Any] = []  # sequences of entries pruned from another thread

    # ------------------------------------------------------------------ request lifecycle (engine thread)

    def acquire(self, namespace: str, prompt: Sequence[int], *, hint: str | None = None, max_new_tokens: int = 1,
                describe_position: Callable[[int], str] | None = None, request_id: str = "",
                defer: bool = False) -> SequenceLease:
        """`defer`: as PrefixCache.acquire — an SSD read that pays is left in `lease.pending`, the near-miss
        diagnosis in `lease.diagnose`, for the caller to run off the engine thread."""
        prompt = tuple(prompt)
        limit = len(prompt) - 1
        reserve = len(prompt) + min(max_new_tokens, self.config.decode_reserve_tokens)
        with self._lock:
            entry, shared, hinted = self._device_match(namespace, prompt, hint)
            self._make_room(reserve, keep=entry)
            self.reserved += reserve
        try:
            lease = self._open(namespace, prompt, hint, reserve, entry, min(shared, limit), hinted)
        except BaseException:
            with self._lock:
                self.reserved -= reserve
            raise
        lease.pending = self._plan_ssd(lease, limit)
        lease.diagnose = partial(self._note_near_miss, lease, entry, shared, describe_position, request_id)
        if not defer:
            if lease.pending is not None:
                self.complete_ssd(lease, self._outcome(lease))
            self.diagnose(lease)
        with self._lock:
            self._count_acquired(len(prompt), lease)
        return lease

    def read_ssd(self, lease: SequenceLease) -> memoryview:
        """The disk part of a deferred restore (any thread): the snapshot's state bytes, verified. Raises
        SnapshotInvalid (the snapshot quarantined) when the blob is damaged."""
        started = time.perf_counter()
        state = self.store.read(lease.pending.row)
        lease.restore_s = time.perf_counter() - started
        return state

    def complete_ssd(self, lease: SequenceLease, outcome: memoryview | BaseException) -> None:
        """Engine thread: load the read state into a new sequence, cropped to the shared prefix, in place of
        what the device tier gave; or keep that when the snapshot was rejected (damaged, or refused by the
        engine)."""
        match, lease.pending = lease.pending, None
        if not isinstance(outcome, BaseException):
            started = time.perf_counter()
            try:
                seq = self.engine.import_state(outcome, match.row.length)
            except Exception as exc:  # state the engine refuses: set aside like a damaged blob
                self.store.quarantine(match.row)
                outcome = exc
            else:
                self.engine.crop(seq, match.length)
                self.engine.release(lease.sequence)
                lease.restore_s += time.perf_counter() - started
                self.cost.observe_restore(match.row.nbytes, lease.restore_s)
                gain = match.length - lease.cached_tokens
                lease.sequence, lease.cached_tokens = seq, match.length
                lease.tier = Tier.hit(Tier.SSD, match.hinted)
                lease.round = match.row.round + 1 if match.length >= match.row.prompt_len else 1
                with self._lock:
                    self.counters.ssd_hits += 1
                    self.counters.cached_tokens += gain
                return
        if not isinstance(outcome, Exception):
            raise outcome
        with self._lock:
            self.counters.ssd_rejected += 1
        lease.rejected = f"SSD snapshot {match.row.id} set aside: {outcome}"
        log.warning("kv cache: SSD snapshot %s rejected, prefilling instead: %s", match.row.id, outcome)

    def _outcome(self, lease: SequenceLease) -> memoryview | BaseException:
        try:
            return self.read_ssd(lease)
        except SnapshotInvalid as exc:
            return exc

    def admission_need(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Pool cells a request reserves while it runs (the scheduler's unit of room)."""
        return prompt_tokens + min(max_new_tokens, self.config.decode_reserve_tokens)

    def admission_room(self) -> int:
        """Pool cells not reserved by running requests (kept entries are evicted to make room)."""
        with self._lock:
            return self.cells - self.reserved

    def finish(self, lease: SequenceLease, sequence: Sequence[int], state: Any, *, entry_id: str,
               prompt_length: int, hint_key: str | None = None, buffers: Any = None) -> bool:
        """`state` is the request's engine sequence, holding exactly `sequence`; it becomes an entry."""
        sequence = tuple(sequence)
        hint_key = hint_key or (lease.hint if lease.hint not in self.entries_by_id else None)
        with self._lock:
            self._end(lease)
            if self.config.rounds == 0 or not sequence or len(sequence) + self.reserved > self.cells:
                self.engine.release(state)
                self.counters.not_kept += 1
                return False
            self._submit_snapshot(lease, sequence, state, entry_id, prompt_length, hint_key)
            self._drop_superseded(lease.namespace, sequence)
            self.entries_by_id[entry_id] = SequenceEntry(entry_id, lease.namespace, sequence, state, prompt_length,
                                                         lease.round, hint_key)
            self._make_room(0)
            self.counters.kept += 1
            return entry_id in self.entries_by_id

    def release(self, lease: SequenceLease, buffers: Any = None) -> None:
        with self._lock:
            if not lease.done:
                self._end(lease)
                self.engine.release(lease.sequence)

    # ------------------------------------------------------------------ any thread

    def stats(self) -> CacheStats:
        ssd = self._ssd_stats()  # under the SSD store's own lock, not this one
        with self._lock:
            entries = list(self.entries_by_id.values())
            held = sum(e.length for e in entries)
            return CacheStats(
                device_bytes=held * self.bytes_per_token,
                device_budget_bytes=self.cells * self.bytes_per_token,
                # the pool is allocated whole: what entries do not hold is the running rows' room
                pool_bytes=max(self.cells - held, 0) * self.bytes_per_token,
                pool_in_use_bytes=self.reserved * self.bytes_per_token,
                retained_bytes=held * self.bytes_per_token,
                entries=len(entries), nodes=len(entries), namespaces=len({e.namespace for e in entries}),
                **self._common_stats(), **ssd)

    def entries(self) -> list[CacheEntry]:
        with self._lock:
            device = [CacheEntry(tier=Tier.DEVICE, id=e.id, namespace=e.namespace, tokens=e.length,
                                 prompt_tokens=e.prompt_length, bytes=e.length * self.bytes_per_token,
                                 round=e.round, hits=e.hits, created=e.created)
                      for e in sorted(self.entries_by_id.values(), key=lambda e: e.last_used, reverse=True)]
        return device + self._ssd_entries()

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None, tiers: tuple[Tier, ...] = STORE_TIERS) -> PruneCounts:
        """Device entries leave the listing now and give their sequences back at the engine's next acquire
        (the pool is engine-thread only)."""
        device_freed, ssd_removed = 0, 0
        if Tier.DEVICE in tiers:
            with self._lock:
                for entry in self._doomed(older_than_s, max_bytes, namespace):
                    self._pending_release.append(self.entries_by_id.pop(entry.id).seq)
                    device_freed += entry.length * self.bytes_per_token
        if Tier.SSD in tiers and self.store is not None:
            ssd_removed = len(self.store.prune(older_than_s=older_than_s, max_bytes=max_bytes, namespace=namespace))
        return PruneCounts(device_freed_bytes=device_freed, ssd_removed=ssd_removed)

    def _doomed(self, older_than_s: float | None, max_bytes: int | None, namespace: str | None) -> list:
        """Entries a prune drops: by age and/or namespace, then least recently used down to `max_bytes`."""
        now, entries = time.time(), list(self.entries_by_id.values())
        doomed = [] if older_than_s is None and namespace is None else [
            e for e in entries if (namespace is None or e.namespace == namespace)
            and (older_than_s is None or now - e.created > older_than_s)]
        if max_bytes is not None:
            left = sorted((e for e in entries if e not in doomed), key=lambda e: e.last_used)
            total = sum(e.length for e in left) * self.bytes_per_token
            for entry in left:
                if total <= max_bytes:
                    break
                doomed.append(entry)
                total -= entry.length * self.bytes_per_token
        return doomed

    def check_integrity(self) -> None:
        with self._lock:
            assert self.reserved >= 0, "reservations never go negative"
            for entry in self.entries_by_id.values():
                assert self.engine.length(entry.seq) == entry.length, f"entry {entry.id} lost cells"
        self.flush()

    def close(self) -> None:
        """After the engine thread stopped: finish SSD writes, give every entry's sequence back to the pool."""
        self._close_tiers()
        with self._lock:
            self._release_pending()
            for entry in list(self.entries_by_id.values()):
                self._evict(entry)

    # ------------------------------------------------------------------ internals (engine thread)

    def _device_match(self, namespace: str, prompt: tuple[int, ...], hint: str | None
                      ) -> tuple[SequenceEntry | None, int, bool]:
        self._release_pending()
        best, best_shared, hinted = None, 0, False
        for entry in self.entries_by_id.values():
            if entry.namespace != namespace:
                continue
            shared = common_prefix_length(entry.tokens, prompt)
            named = hint is not None and hint in (entry.id, entry.hint_key) and shared == entry.length
            if named or (shared > best_shared and not hinted):
                best, best_shared, hinted = entry, shared, named
        return best, best_shared, hinted

    def _open(self, namespace: str, prompt: tuple[int, ...], hint: str | None, reserve: int,
              entry: SequenceEntry | None, device_length: int, hinted: bool) -> SequenceLease:
        if entry is not None and device_length > 0:
            entry.last_used, entry.hits = time.monotonic(), entry.hits + 1
            seq = self.engine.share(entry.seq, device_length)
            return SequenceLease(namespace, prompt, device_length, Tier.hit(Tier.DEVICE, hinted), sequence=seq,
                                 reserved=reserve, round=entry.round + 1, hint=hint)
        return SequenceLease(namespace, prompt, 0, Tier.COLD, sequence=self.engine.open(), reserved=reserve, hint=hint)

    def _plan_ssd(self, lease: SequenceLease, limit: int) -> SequenceMatch | None:
        """The snapshot worth reading instead of recomputing, cut to what the request shares with it (memory
        only: the index is mirrored in RAM)."""
        if self.store is None or lease.cached_tokens >= limit:
            return None
        match = self.store.lookup(lease.namespace, lease.prompt, lease.hint)
        if match is None or min(match.length, limit) <= lease.cached_tokens:
            return None
        length = min(match.length, limit)
        if not self.cost.restore_pays(length - lease.cached_tokens, match.row.nbytes):
            with self._lock:
                self.counters.ssd_not_worth_it += 1
            return None
        return SequenceMatch(match.row, length, match.hinted)

    def _note_near_miss(self, lease: SequenceLease, entry: SequenceEntry | None, shared: int,
                        describe: Callable[[int], str] | None, request_id: str) -> None:
        near = self.near_miss_log
        if entry is not None and not lease.tier.from_ssd and near.qualifies(shared, entry.length, len(lease.prompt)):
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=entry.id, tier=Tier.DEVICE,
                                          request=lease.prompt, entry=entry.tokens, shared=shared,
                                          prompt_length=entry.prompt_length, describe=describe,
                                          request_id=request_id)
            return
        diverged = self.store.diverging(lease.namespace, lease.prompt) if self.store is not None else None
        if diverged is not None and near.qualifies(diverged.length, diverged.row.length, len(lease.prompt)):
            row = diverged.row
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=row.id, tier=Tier.SSD,
                                          request=lease.prompt, entry=unpack_tokens(row.tokens),
                                          shared=diverged.length, prompt_length=row.prompt_len,
                                          describe=describe, request_id=request_id)

    def _submit_snapshot(self, lease: SequenceLease, sequence: tuple[int, ...], seq: Any, entry_id: str,
                         prompt_length: int, hint_key: str | None) -> None:
        if self.writer is None or len(sequence) < self.config.ssd_min_tokens or self.writer.full():
            return
        state = self.engine.export_state(seq)  # a copy out of the pool: the writer thread never touches llama.cpp
        self.writer.submit(SequenceJob(entry_id, lease.namespace, self.config.model, sequence, prompt_length,
                                       lease.round, state, hint_key))

    def _drop_superseded(self, namespace: str, sequence: tuple[int, ...]) -> None:
        for entry in list(self.entries_by_id.values()):
            if entry.namespace == namespace and entry.length <= len(sequence) and \
                    sequence[:entry.length] == entry.tokens:
                self._evict(entry)

    def _make_room(self, need: int, keep: SequenceEntry | None = None) -> None:
        """Evict entries until `need` more tokens and a spare sequence fit: least recently used first, except
        each namespace's main conversation (retention.py). An entry just kept is one of the candidates, so a
        side request's state goes before a main conversation's."""
        self._release_pending()
        while True:
            held = sum(e.length for e in self.entries_by_id.values())
            short_of_ids = self.engine.free_sequences < self.spare_sequences
            if (held + self.reserved + need <= self.cells and not short_of_ids) or not self.entries_by_id:
                return
            candidates = [e for e in self.entries_by_id.values() if e is not keep] or [keep]
            eviction = next_eviction(candidates, self.entries_by_id.values(), time.monotonic())
            if eviction.spared is not None:
                self._spared(eviction)
            self._evict(eviction.victim)
            if keep is not None and keep.id not in self.entries_by_id:
                keep = None

    def _evict(self, entry: SequenceEntry) -> None:
        del self.entries_by_id[entry.id]
        self.engine.release(entry.seq)

    def _release_pending(self) -> None:
        while self._pending_release:
            self.engine.release(self._pending_release.pop())

    def _end(self, lease: SequenceLease) -> None:
        if not lease.done:
            lease.done = True
            self.reserved -= lease.reserved
