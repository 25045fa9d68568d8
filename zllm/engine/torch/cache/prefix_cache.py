"""`PrefixCache`: the one object the runtime talks to. Tiers, pool, writer and diagnostics behind it.

    lease = cache.acquire(namespace, prompt, hint=..., max_new_tokens=..., describe_position=...)  # engine thread
    # lease.working: pooled buffers [1, kv_heads, capacity, head_dim] per tensor; [0, cached) filled
    # prefill prompt[lease.cached_tokens:] (never empty), decode ...
    cache.finish(lease, sequence, state, entry_id=..., prompt_length=...)    # keep the terminal state
    # or cache.release(lease) when the state must not be kept (the request failed mid-forward)

Lookup order: the device tier's longest prefix (an exact id / client key hint is verified against it), then
the SSD tier when it has a longer prefix and the measured estimate says reading beats recomputing, else cold.
A hit never covers the whole prompt: the last prompt token is always prefilled, because its logits are what
the first output token is sampled from.

Thread safety: `acquire`/`finish`/`release` run on the engine thread; `stats`, `entries`, `prune` and
`near_misses` may be called from any thread (one lock guards the device tier).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from zllm.cache_views import STORE_TIERS, CacheEntry, CacheStats, PruneCounts, Tier
from zllm.engine.torch.cache.device_tier import DeviceLookup, DeviceTier, Entry
from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.radix import Match, Node
from zllm.engine.torch.cache.ssd_format import SnapshotInvalid
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch
from zllm.engine.torch.cache.state import KVLayout, KVState, clone_state, copy_into, slice_state
from zllm.diagnosis.near_miss import NearMiss
from zllm.kvcache.config import CacheConfig
from zllm.kvcache.retention import Newcomer
from zllm.kvcache.ssd_index import unpack_tokens
from zllm.kvcache.tiers import BaseLease, CacheTiers, open_ssd_tier

log = logging.getLogger("zllm.kvcache")


@dataclass(eq=False)
class Lease(BaseLease):
    """A lease on the torch cache: pooled working buffers holding the restored prefix."""

    working: KVState = field(kw_only=True)  # room for prompt + reserved decode; [0, cached_tokens) restored
    locked: Node | None = None
    lineage: Entry | None = None  # the device entry this request's conversation continues


class PrefixCache(CacheTiers):
    def __init__(self, config: CacheConfig, layout: KVLayout, device: torch.device | str, *,
                 decode: Callable[[Sequence[int]], str] | None = None, cost_key: str = ""):
        store, ssd_off = open_ssd_tier(partial(SnapshotStore, config.ssd_dir, layout, config.ssd_budget_bytes)) \
            if config.ssd_dir else (None, None)
        super().__init__(config, store, f"cost:{layout.key}:{torch.device(device).type}:{cost_key}", decode,
                         ssd_off)
        self.layout = layout
        self.device_tier = DeviceTier(config.device_budget_bytes, max(config.rounds, 1), on_spared=self._spared)
        self.pool = BufferPool(layout, device)

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
        with self._lock:
            found = self.device_tier.lookup(namespace, prompt, hint)
            match = found.match.truncated(limit)
            locked = self.device_tier.lock(match)
            capacity = len(prompt) + min(max_new_tokens, self.config.decode_reserve_tokens)
            self._make_room_for_pool(capacity)
            working = self.pool.take(capacity)
            _copy_path(match, working)
        lineage = found.best.entry if found.best is not None and found.best.continues else None
        tier = Tier.hit(Tier.DEVICE, found.hint_verified) if match.length else Tier.COLD
        lease = Lease(namespace, prompt, match.length, tier, working=working, locked=locked, lineage=lineage,
                      round=lineage.round + 1 if lineage else 1, hint=hint)
        try:
            lease.pending, diverged = self._plan_ssd(lease, limit)
            lease.diagnose = partial(self._note_near_miss, lease, found, diverged, describe_position, request_id)
            if not defer:
                if lease.pending is not None:
                    self.complete_ssd(lease, self._outcome(self.read_ssd, lease))
                self.diagnose(lease)
        except BaseException:  # the caller never sees this lease: give its lock and buffers back now
            self.release(lease)
            raise
        with self._lock:
            self._count_acquired(len(prompt), lease)
            if lease.tier.on_device and lineage is not None:
                self.device_tier.touch(lineage)
        return lease

    def read_ssd(self, lease: Lease) -> int:
        """The disk part of a deferred SSD restore (any thread: it fills only this lease's working buffers);
        returns the bytes read. Raises SnapshotInvalid (the snapshot quarantined) when a blob is bad.

        Under inference mode: the working buffers were made under it, and only inference mode may update them
        in place (the restore thread is not the engine thread, which runs in it for its whole life)."""
        match = lease.pending
        assert match is not None, "nothing to read"
        started = time.perf_counter()
        with torch.inference_mode():
            nbytes = self.store.restore(match, lease.working, self.pool, skip=lease.cached_tokens)
        lease.restore_s = time.perf_counter() - started
        return nbytes

    def complete_ssd(self, lease: Lease, outcome: int | BaseException) -> None:
        """Engine thread, after `read_ssd` returned `outcome` (bytes read) or raised it: the lease now starts
        from the restored prefix, or from what the device tier gave when the snapshot was rejected."""
        match, lease.pending = lease.pending, None
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, SnapshotInvalid):
                raise outcome
            with self._lock:
                self.counters.ssd_rejected += 1
            lease.rejected = f"SSD snapshot {match.row.id} set aside: {outcome}"
            log.warning("kv cache: SSD snapshot rejected, prefilling instead: %s", outcome)
            return
        self.cost.observe_restore(outcome, lease.restore_s)
        gain = match.length - lease.cached_tokens
        lease.cached_tokens, lease.tier = match.length, Tier.hit(Tier.SSD, match.hinted)
        if lease.lineage is None and match.length >= match.row.prompt_len:
            lease.round = match.row.round + 1
        with self._lock:
            self.counters.ssd_hits += 1
            self.counters.cached_tokens += gain

    @staticmethod
    def _outcome(read: Callable, lease) -> object:
        try:
            return read(lease)
        except SnapshotInvalid as exc:
            return exc

    def admission_need(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Bytes of working buffers a request would hold while it runs (the scheduler's unit of room)."""
        return self.pool.bytes_for(prompt_tokens + min(max_new_tokens, self.config.decode_reserve_tokens))

    def admission_room(self) -> int:
        """Bytes of the device budget not held by running requests' working buffers."""
        with self._lock:
            return self.device_tier.budget_bytes - self.pool.in_use_bytes()

    def finish(self, lease: Lease, sequence: Sequence[int], state: KVState, *, entry_id: str,
               prompt_length: int, hint_key: str | None = None, buffers: KVState | None = None) -> bool:
        """Keep the terminal state: `state` holds KV for exactly `sequence` (prompt + the generated tokens that
        were fed forward). `buffers`: the working buffers the request ended with, if it outgrew the lease's.
        Returns whether the device tier kept it."""
        sequence = tuple(sequence)
        # a hint that named an entry is a continuation id, not a client key worth remembering
        hint_key = hint_key or (lease.hint if lease.hint not in self.device_tier.entries else None)
        with self._lock:
            entry = self._keep_resident(lease, sequence, state, entry_id, prompt_length, hint_key)
            if entry is not None:
                self.counters.kept += 1
            else:
                self.counters.not_kept += 1
            self._submit_snapshot(lease, sequence, state, entry, entry_id, prompt_length, hint_key)
            self._end(lease, buffers)
        return entry is not None

    def release(self, lease: Lease, buffers: KVState | None = None) -> None:
        """End a lease without keeping anything (the request failed; its KV may be inconsistent)."""
        with self._lock:
            self._end(lease, buffers)

    # ------------------------------------------------------------------ any thread

    def stats(self) -> CacheStats:
        ssd = self._ssd_stats()  # under the SSD store's own lock, not this one
        with self._lock:
            tier = self.device_tier
            return CacheStats(
                device_bytes=tier.bytes, device_budget_bytes=tier.budget_bytes, pool_bytes=self.pool.bytes,
                pool_in_use_bytes=self.pool.in_use_bytes(),
                # bytes on retained entries' paths: equals device_bytes unless something else (a lock) pins nodes
                retained_bytes=sum(n.nbytes for n in {n for e in tier.entries.values() for n in e.node.path()}),
                entries=len(tier.entries), nodes=sum(len(t.nodes()) for t in tier.trees.values()),
                namespaces=len(tier.trees), **self._common_stats(), **ssd)

    def entries(self) -> list[CacheEntry]:
        """Everything cached, newest use first: device entries, then SSD snapshots."""
        with self._lock:
            device = [CacheEntry(tier=Tier.DEVICE, id=e.id, namespace=e.namespace, tokens=e.length,
                                 prompt_tokens=e.prompt_length, bytes=_exclusive_bytes(e.node), round=e.round,
                                 hits=e.hits, created=e.created)
                      for e in sorted(self.device_tier.entries.values(), key=lambda e: e.last_used, reverse=True)]
        return device + self._ssd_entries()

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None, tiers: tuple[Tier, ...] = STORE_TIERS) -> PruneCounts:
        """Drop cached state by age and/or namespace, then down to `max_bytes` per tier."""
        device_freed, ssd_removed = 0, 0
        if Tier.DEVICE in tiers:
            with self._lock:
                if older_than_s is not None or namespace is not None:
                    device_freed += self.device_tier.prune(older_than_s=older_than_s, namespace=namespace)
                if max_bytes is not None:
                    saved, self.device_tier.budget_bytes = self.device_tier.budget_bytes, max_bytes
                    device_freed += self.device_tier.make_room(0)
                    self.device_tier.budget_bytes = saved
        if Tier.SSD in tiers and self.store is not None:
            ssd_removed = len(self.store.prune(older_than_s=older_than_s, max_bytes=max_bytes, namespace=namespace))
        return PruneCounts(device_freed_bytes=device_freed, ssd_removed=ssd_removed)

    def check_integrity(self) -> None:
        with self._lock:
            self.device_tier.check_integrity()
        if self.store is not None:
            self.flush()
            self.store.check_integrity()

    def close(self) -> None:
        self._close_tiers()

    # ------------------------------------------------------------------ internals

    def _plan_ssd(self, lease: Lease, limit: int) -> tuple[SsdMatch | None, SsdMatch | None]:
        """(the SSD prefix worth reading instead of recomputing, if any; the best diverging snapshot, for the
        near-miss log). Memory only: the index is mirrored in RAM."""
        if self.store is None or lease.cached_tokens >= limit:
            return None, None
        match, diverged = self.store.lookup(lease.namespace, lease.prompt, lease.hint)
        if match is None or min(match.length, limit) <= lease.cached_tokens:
            return None, diverged
        length = min(match.length, limit)
        gain = length - lease.cached_tokens
        if not self.cost.restore_pays(gain, gain * self.layout.bytes_per_token):
            with self._lock:
                self.counters.ssd_not_worth_it += 1
            return None, diverged
        return SsdMatch(match.row, length, match.hinted), diverged

    def _note_near_miss(self, lease: Lease, found: DeviceLookup, diverged: SsdMatch | None,
                        describe: Callable[[int], str] | None, request_id: str) -> None:
        best, near = found.best, self.near_miss_log
        if best is not None and near.qualifies(best.matched, best.entry.length, len(lease.prompt)):
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=best.entry.id, tier=Tier.DEVICE,
                                          request=lease.prompt, entry=best.entry.node.sequence(),
                                          shared=best.matched, prompt_length=best.entry.prompt_length,
                                          describe=describe, request_id=request_id)
        elif diverged is not None and near.qualifies(diverged.length, diverged.row.length, len(lease.prompt)):
            row = diverged.row
            lease.near_miss = near.record(namespace=lease.namespace, entry_id=row.id, tier=Tier.SSD,
                                          request=lease.prompt, entry=unpack_tokens(row.tokens),
                                          shared=diverged.length, prompt_length=row.prompt_len, describe=describe,
                                          request_id=request_id)

    def _keep_resident(self, lease: Lease, sequence: tuple[int, ...], state: KVState, entry_id: str,
                       prompt_length: int, hint_key: str | None) -> Entry | None:
        """Evict first, then admit; the pooled working set stays allocated, so it counts against the budget."""
        if self.config.rounds == 0 or not sequence:
            return None
        tier, reserved = self.device_tier, self.pool.bytes
        new = tier.new_bytes(lease.namespace, sequence, state)
        if new + reserved > tier.budget_bytes:
            return None  # it could not fit even alone: evicting everything else would be for nothing
        # a side request's state may not push out the namespace's main conversation (retention.py)
        tier.make_room(new, reserved=reserved,
                       newcomer=Newcomer(lease.namespace, len(sequence), lease.round, tier.now()))
        return tier.insert(lease.namespace, sequence, state, entry_id=entry_id, prompt_length=prompt_length,
                           lineage=lease.lineage, hint_key=hint_key, reserved=reserved)

    def _submit_snapshot(self, lease: Lease, sequence: tuple[int, ...], state: KVState, entry: Entry | None,
                         entry_id: str, prompt_length: int, hint_key: str | None) -> None:
        if self.writer is None or len(sequence) < self.config.ssd_min_tokens or self.writer.full():
            return
        if entry is not None:  # the tree's spans are immutable once inserted: hand them over without a copy
            sources = tuple((node.start, node.kv) for node in entry.node.path())
        else:  # the working buffers are reused by the next request: the writer gets its own copy
            sources = ((0, clone_state(slice_state(state, 0, len(sequence)))),)
        self.writer.submit(SnapshotJob(entry_id, lease.namespace, self.config.model, sequence, prompt_length,
                                       lease.round, sources, hint_key))

    def _end(self, lease: Lease, buffers: KVState | None) -> None:
        if lease.done:
            return
        lease.done = True
        self.device_tier.unlock(lease.namespace, lease.locked)
        self.pool.give_back(lease.working, buffers)

    def _make_room_for_pool(self, capacity: int) -> None:
        """Evict so that the tier plus a working set of `capacity` tokens fits the budget (evict, then admit)."""
        needed = self.pool.bytes_for(capacity)
        idle = self.pool.idle_bytes()
        if idle >= needed:
            return  # the idle set is reused as is
        self.pool.discard_idle()
        self.device_tier.make_room(needed, reserved=self.pool.bytes)


def _copy_path(match: Match, working: KVState) -> None:
    """Concatenate the matched path's spans into the working buffers (one memory copy per span)."""
    for node, take in match.steps:
        assert node.kv is not None
        copy_into(working, node.start, slice_state(node.kv, 0, take))


def _exclusive_bytes(node: Node) -> int:
    """Bytes freed if only this node's entry went: the tail of its path that nothing else needs."""
    if node.children or len(node.entries) > 1 or node.locks:
        return 0
    total, current = node.nbytes, node.parent
    while current is not None and not current.is_root and len(current.children) == 1 \
            and not current.entries and not current.locks:
        total += current.nbytes
        current = current.parent
    return total
