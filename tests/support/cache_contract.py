"""One harness, one prefix cache on both backends: the tiny qwen3 served on torch (PrefixCache over TorchKV and a
ModelRunner) and on llama.cpp (PrefixCache over LlamaKV and a LlamaCppEngine), driven only through the two seams the runtime uses —
the cache's (zllm/kvcache/contract.py) and the engine's (zllm/engine/contract.py) — in the engine loop's order.

    @pytest.fixture(scope="module", params=BACKENDS)
    def backend(request):
        yield from contract_backend(request.param)

    cache = backend.cache(tmp_path / "kv")           # built as the daemon builds it (runtime/prefix.py)
    lease, logits = backend.ask(cache, prompt)        # acquire (defer=True) → SSD read → open → prefill → release
    backend.assert_restored_exactly(lease, logits)    # ≡ a full prefill, within the backend's tolerance
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.backends import load_tiny
from zllm.engine.contract import Engine, Row
from zllm.kvcache import CacheConfig
from zllm.kvcache.contract import CacheLease, KVPrefixCache
from zllm.kvcache.ssd_index import SnapshotInvalid

NS = "ns"
# restore ≡ full prefill, per backend. torch (CPU, float32): a restored prefix plus the appended prefill gives a
# whole-prompt prefill's logits within 1e-4, absolute. llama.cpp: a restored prefix is exact (the same cells a cold
# prefill of the prefix leaves), but its kernels depend on the batch shape — a 1-row batch takes another matmul
# than a prefill chunk (README, "A cached prefix answers like a cold prefill") — so the reference is a cold
# sequence fed in the same pieces (the prefix as it was computed, then the rest), within 1e-4 of the largest
# logit, and the same argmax.
ABSOLUTE, RELATIVE = 1e-4, 1e-4


@dataclass
class ContractBackend:
    name: str
    loaded: Any
    engine: Engine
    bytes_per_token: int = 0

    def cache(self, ssd_dir: Path | None = None, *, budget_tokens: int | None = None,
              **config) -> KVPrefixCache[Any]:
        """A prefix cache as the daemon builds it; `budget_tokens`: the device budget in tokens of KV."""
        from zllm.runtime.prefix import build_prefix_cache

        budget = budget_tokens * self.bytes_per_token if budget_tokens is not None else 64 << 20
        if ssd_dir is not None:
            config = {"ssd_dir": ssd_dir, "ssd_min_tokens": 1, **config}
        return build_prefix_cache(self.loaded, CacheConfig(device_budget_bytes=budget, **config), max_batch=1)

    def tier_dir(self, ssd_dir: Path) -> Path:
        """Where a cache configured with `ssd_dir` keeps its SSD tier (runtime/prefix.py names llama.cpp's)."""
        return ssd_dir if self.name == "torch" else ssd_dir.with_name(f"{ssd_dir.name}-{self.name}")

    # ------------------------------------------------------------------ requests, in the engine loop's order

    def acquire(self, cache: KVPrefixCache[Any], prompt: Sequence[int], *, namespace: str = NS,
                hint: str | None = None, max_new_tokens: int = 1, describe=None) -> CacheLease:
        """The engine loop's admission: a deferred acquire, the diagnosis, the SSD read (off the engine thread in
        the loop; here inline) and its completion."""
        lease = cache.acquire(namespace, tuple(prompt), hint=hint, max_new_tokens=max_new_tokens,
                              describe_position=describe, request_id="r", defer=True)
        cache.diagnose(lease)
        if lease.pending is not None:
            try:
                outcome = cache.read_ssd(lease)
            except SnapshotInvalid as exc:
                outcome = exc
            cache.complete_ssd(lease, outcome)
        return lease

    def run(self, cache: KVPrefixCache[Any], prompt: Sequence[int], rid: str, *, generate: int = 0,
            namespace: str = NS, hint: str | None = None) -> tuple[CacheLease, list[int]]:
        """One request to its end: prefill, `generate` greedy tokens (all but the last fed forward, as the engine
        loop does), keep the terminal state. Returns the lease and the generated tokens."""
        prompt = tuple(prompt)
        lease = self.acquire(cache, prompt, namespace=namespace, hint=hint, max_new_tokens=max(generate, 1))
        seq = self.engine.open(lease)
        logits = self.engine.step([Row(seq, prompt[lease.cached_tokens:])])[0]
        generated: list[int] = []
        for n in range(generate):
            generated.append(int(logits.argmax()))
            if n + 1 < generate:
                logits = self.engine.step([Row(seq, generated[-1:])])[0]
        kept = self.engine.kept_state(seq)
        held = self.engine.length(seq)
        cache.finish(lease, (*prompt, *generated)[:held], kept.state, entry_id=rid, prompt_length=len(prompt),
                     buffers=kept.buffers)
        return lease, generated

    def ask(self, cache: KVPrefixCache[Any], prompt: Sequence[int], **kwargs) -> tuple[CacheLease, np.ndarray]:
        """A request's prompt logits over what the cache restored; its lease released (nothing kept)."""
        prompt = tuple(prompt)
        lease = self.acquire(cache, prompt, **kwargs)
        seq = self.engine.open(lease)
        logits = self.engine.step([Row(seq, prompt[lease.cached_tokens:])])[0]
        cache.release(lease, self.engine.kept_state(seq).buffers)
        return lease, as_numpy(logits)

    def cold(self, prompt: Sequence[int], pieces: Sequence[int] = ()) -> np.ndarray:
        """The reference logits, no cache anywhere: a full prefill (on llama.cpp fed in `pieces` — token counts —
        then the rest: the batch shapes the restored request's tokens were computed in)."""
        prompt, start = tuple(prompt), 0
        seq = self.engine.open(None)
        for piece in pieces if self.name == "llamacpp" else ():
            if piece:
                self.engine.step([Row(seq, prompt[start:start + piece])])
                start += piece
        logits = self.engine.step([Row(seq, prompt[start:])])[0]
        self.engine.release(seq)
        return as_numpy(logits)

    def assert_restored_exactly(self, lease: CacheLease, logits: np.ndarray, pieces: Sequence[int] = ()) -> None:
        """Restore ≡ full prefill, within this backend's stated tolerance. `pieces`: how the cached prefix was
        fed when it was computed (default: one prefill of it)."""
        want = self.cold(lease.prompt, pieces or (lease.cached_tokens,))
        if self.name == "torch":
            assert np.abs(logits - want).max() < ABSOLUTE
        else:
            assert np.abs(logits - want).max() <= RELATIVE * np.abs(want).max()
        assert int(logits.argmax()) == int(want.argmax())


def as_numpy(logits) -> np.ndarray:
    return logits if isinstance(logits, np.ndarray) else logits.float().cpu().numpy()


def contract_backend(name: str, context_length: int = 4096):
    """A generator for a module-scoped fixture: the tiny qwen3 on `name`, its engine, entered as the engine
    thread is (torch: inference mode, one intra-op thread)."""
    loaded = replace(load_tiny("qwen3", name, context_length=context_length), context_length=context_length)
    if name == "llamacpp":
        engine = loaded.engine
    else:
        from zllm.engine.torch.runner import ModelRunner

        engine = ModelRunner(loaded.model, prefill_chunk=256)  # chunk boundaries inside the prompts too
    backend = ContractBackend(name, loaded, engine)
    try:
        with engine.engine_thread(1):
            probe = backend.cache()
            backend.bytes_per_token = _bytes_per_token(probe)
            probe.close()
            yield backend
    finally:
        loaded.close()


def _bytes_per_token(cache) -> int:
    return cache.kv.bytes_per_token
