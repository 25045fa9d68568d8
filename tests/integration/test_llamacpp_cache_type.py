"""`--cache-type q8_0` on the default model (issue 26): Q8_0 KV cells hold 1.88x the tokens of F16 in one budget,
a device hit and an SSD hit still equal a full prefill (the cache contract's tolerance), a snapshot written
with one cell type is a clean miss for a pool of another (never read into it, kept for a restart with its own
type) and, even if a namespace were shared, set aside instead of misread; and a daemon serves it, saying so.

The default model, because Q8_0 cells hold 32-element blocks and the tiny test models' heads are 16 wide."""

from __future__ import annotations

import random
from pathlib import Path

import openai
import pytest

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

from tests.integration.conftest import linked_data_dir  # noqa: E402
from tests.support.cache_contract import ContractBackend  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402
from tests.support.default_gguf import NAME, default_f16_data_dir  # noqa: E402
from zllm.kvcache import request_namespace  # noqa: E402
from zllm.runtime.prefix import served_model_key  # noqa: E402

WINDOW, BUDGET_MB = 2048, 128  # a pool larger than the window, so the budget sizes it


def tokens(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(30, 4000) for _ in range(n))


BASE, NEW = tokens(300, seed=5), tokens(7, seed=6)


def load(cache_type: str, exact: bool = False) -> ContractBackend:
    from zllm.engine.llamacpp.loader import load_gguf_model

    loaded = load_gguf_model(default_f16_data_dir() / "models" / NAME, threads=1, context_length=WINDOW,
                             cache_budget_mb=BUDGET_MB, exact_cache=exact, cache_type=cache_type)
    return ContractBackend("llamacpp", loaded, loaded.engine, loaded.engine.bytes_per_token)


@pytest.fixture(scope="module")
def pools():
    f16, q8_0 = load("f16"), load("q8_0")
    yield {"f16": f16, "q8_0": q8_0}
    f16.loaded.close()
    q8_0.loaded.close()


def caller(backend: ContractBackend) -> str:
    """The namespace the engine loop gives a request of one caller on this pool (runtime/engine_loop.py)."""
    return request_namespace(served_model_key(backend.loaded), "caller")


def test_a_q8_0_pool_holds_1_88x_the_tokens_of_an_f16_one_in_one_budget(pools) -> None:
    import llama_cpp as lc

    f16, q8_0 = pools["f16"].engine, pools["q8_0"].engine
    assert (pools["f16"].loaded.kv_cache_type, pools["q8_0"].loaded.kv_cache_type) == ("f16", "q8_0")
    assert q8_0.settings.flash_attention == lc.LLAMA_FLASH_ATTN_TYPE_ENABLED and not q8_0.settings.exact
    assert 1.85 < q8_0.cells / f16.cells < 1.9, (f16.cells, q8_0.cells)  # 64 / 34, less llama.cpp's rounding
    assert 1.85 < f16.bytes_per_token / q8_0.bytes_per_token < 1.9
    assert abs(q8_0.kv_bytes - (BUDGET_MB << 20)) < 256 * q8_0.bytes_per_token  # the budget, to a 256-cell step


def test_the_cells_type_and_exact_mode_are_part_of_the_kv_identity(pools) -> None:
    keys = {kind: backend.loaded.cache_dtype for kind, backend in pools.items()}
    assert keys == {"f16": "llamacpp:F16", "q8_0": "llamacpp:F16:kv-q8_0"}  # F16's as before: old tiers stay valid
    exact = load("auto", exact=True)
    try:
        assert exact.loaded.cache_dtype == "llamacpp:F16:kv-q8_0:exact"  # its KV bits are computed otherwise
    finally:
        exact.loaded.close()
    assert served_model_key(pools["f16"].loaded) != served_model_key(pools["q8_0"].loaded)


def test_q8_0_device_and_ssd_hits_equal_a_full_prefill(pools, tmp_path) -> None:
    backend = pools["q8_0"]
    boundaries = [(100, NEW), (300, NEW), (300, ())]  # a prefix inside the snapshot, all of it and more, all of it
    cache = backend.cache(tmp_path / "kv")
    backend.run(cache, BASE, "base")
    for tier in ("device", "ssd"):
        for keep, appended in boundaries:
            lease, logits = backend.ask(cache, BASE[:keep] + appended)
            assert (lease.tier, lease.cached_tokens) == (tier, min(keep, keep + len(appended) - 1))
            backend.assert_restored_exactly(lease, logits)
        cache.close()  # drains the writer; the restarted cache has only the SSD tier
        cache = backend.cache(tmp_path / "kv")
    cache.close()


def test_a_snapshot_is_a_clean_miss_for_a_pool_of_another_cell_type(pools, tmp_path) -> None:
    f16, q8_0 = pools["f16"], pools["q8_0"]
    cache = f16.cache(tmp_path / "kv")
    f16.run(cache, BASE, "written-f16", namespace=caller(f16))
    cache.close()

    cache = q8_0.cache(tmp_path / "kv")  # a restart with --cache-type q8_0 on the same SSD tier
    lease, logits = q8_0.ask(cache, BASE + NEW, namespace=caller(q8_0))
    stats = cache.stats()
    assert (lease.tier, lease.cached_tokens, stats.ssd.snapshots, stats.ssd.quarantined) == ("cold", 0, 1, 0)
    q8_0.assert_restored_exactly(lease, logits)  # a cold prefill's logits
    q8_0.run(cache, BASE, "written-q8_0", namespace=caller(q8_0))
    cache.close()

    cache = f16.cache(tmp_path / "kv")  # back to f16: its own snapshot is still there, and restores
    lease, logits = f16.ask(cache, BASE + NEW, namespace=caller(f16))
    assert (lease.tier, lease.cached_tokens, cache.stats().ssd.snapshots) == ("ssd", 300, 2)
    f16.assert_restored_exactly(lease, logits)
    cache.close()


def test_a_snapshot_of_another_cell_type_is_set_aside_even_in_a_shared_namespace(pools, tmp_path) -> None:
    """Defence in depth: were the namespaces ever equal, the snapshot's frame names its layout (the KV identity),
    so the read refuses it, it is quarantined and the request runs cold: never Q8_0 cells read as F16 ones."""
    f16, q8_0 = pools["f16"], pools["q8_0"]
    cache = q8_0.cache(tmp_path / "kv")
    q8_0.run(cache, BASE, "written-q8_0")
    cache.close()
    cache = f16.cache(tmp_path / "kv")
    lease, logits = f16.ask(cache, BASE + NEW)  # the contract harness's one namespace for both
    stats = cache.stats()
    assert (lease.tier, lease.cached_tokens, stats.ssd.quarantined) == ("cold", 0, 1)
    assert lease.rejected and "set aside" in lease.rejected
    assert list((f16.tier_dir(tmp_path / "kv") / "quarantine").iterdir()), "kept for inspection"
    f16.assert_restored_exactly(lease, logits)
    cache.close()


def test_a_daemon_serves_q8_0_cells_and_says_so(tmp_path: Path) -> None:
    daemon = Daemon(linked_data_dir(default_f16_data_dir(), tmp_path), NAME, env={
        "ZLLM_CACHE_TYPE": "q8_0", "ZLLM_CONTEXT_LENGTH": str(WINDOW), "ZLLM_CACHE_BUDGET_MB": str(BUDGET_MB),
        "ZLLM_CACHE_DIR": str(tmp_path / "cache")}).wait_ready(timeout=180)
    try:
        (model,) = daemon.control().ps()
        assert model.kv_cache_type == "q8_0" and model.kv_cache_budget_bytes <= (BUDGET_MB + 4) << 20
        assert "q8_0 KV cells" in daemon.log()  # the startup line
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "Name three colours of the rainbow. " * 20}]
        answers = [client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=8)
                   for _ in range(2)]
        assert answers[0].choices[0].message.content
        assert answers[1].usage.prompt_tokens_details.cached_tokens > 0, "a repeat hits the Q8_0 pool"
    finally:
        assert daemon.stop() == 0
