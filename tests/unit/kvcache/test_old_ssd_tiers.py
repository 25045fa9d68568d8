"""SSD tiers an older zllm left on disk are set aside, never misread: torch's safetensors tier (`kv/`, "zllm-kv-2")
and llama.cpp's state-blob tier (`kv-llamacpp/`, "ZLLMSEQ1"), each as the old code wrote it (byte fixtures in
tests/fixtures/old_ssd_tiers/, written by the last zllm with two stores). Opened by the one store
(kvcache/snapshot_store.py), the old row is quarantined, the old blob set aside as a stray and logged, a lookup
is a miss, and writes go on; an old blob under the new name fails the frame's magic at read."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.unit.kvcache.conftest import LAYOUT, torch_cache
from zllm.cache_views import Tier
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore, blob_file
from zllm.kvcache.ssd_index import SnapshotInvalid

FIXTURES = Path(__file__).parents[2] / "fixtures" / "old_ssd_tiers"
TOKENS = tuple(range(100, 116))  # what both old snapshots hold, in namespace "ns"
# (the old tier's directory, its blob's old name, the layout and token bytes the one store opens it with)
OLD_TIERS = {
    "torch": ("kv", "0000000000000000.safetensors", LAYOUT.key, LAYOUT.bytes_per_token),
    "llamacpp": ("kv-llamacpp", "0000000000000000.seqstate", "llamacpp-layout", 0),
}


def old_tier(tmp_path: Path, kind: str) -> Path:
    directory = tmp_path / OLD_TIERS[kind][0]
    shutil.copytree(FIXTURES / OLD_TIERS[kind][0], directory)
    return directory


def store(directory: Path, kind: str) -> SnapshotStore:
    _, _, layout, token_bytes = OLD_TIERS[kind]
    return SnapshotStore(directory, layout, 1 << 30, token_bytes=token_bytes)


@pytest.mark.parametrize("kind", sorted(OLD_TIERS))
def test_an_old_tier_is_set_aside_at_open_and_writes_go_on(tmp_path, kind, caplog) -> None:
    directory = old_tier(tmp_path, kind)
    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
        tier = store(directory, kind)
    stats = tier.stats()
    assert (stats.snapshots, stats.quarantined, stats.strays) == (0, 1, 1)
    assert tier.lookup("ns", TOKENS + (7,)) == (None, None), "the old snapshot is a miss"
    assert "set aside" in caplog.text and "quarantined snapshot" in caplog.text
    assert [p.name.rsplit(".", 1)[0] for p in (directory / "quarantine").iterdir()] == [OLD_TIERS[kind][1]]
    payload = bytes(LAYOUT.bytes_per_token * len(TOKENS)) if kind == "torch" else b"state"
    tier.commit(SnapshotJob("new", "ns", "m", TOKENS, len(TOKENS), 1, lambda: payload))
    tier.check_integrity()
    (match, _) = tier.lookup("ns", TOKENS + (7,))
    assert match.row.id == "new" and bytes(tier.read(match, 0)[0]) == payload
    tier.close()


@pytest.mark.parametrize("kind", sorted(OLD_TIERS))
def test_an_old_blob_under_the_new_name_fails_at_read(tmp_path, kind, caplog) -> None:
    """Even a blob that passes the row check (renamed to the new suffix, its row's size right) is never handed
    to an engine: the frame's magic says it is not this format."""
    directory = old_tier(tmp_path, kind)
    old = directory / "blobs" / OLD_TIERS[kind][1]
    new = old.with_name(blob_file(0))
    old.rename(new)
    db = sqlite3.connect(directory / "index.sqlite")
    db.execute("UPDATE snapshots SET bytes = ?", (new.stat().st_size,))
    db.commit()
    db.close()
    tier = store(directory, kind)
    (match, _) = tier.lookup("ns", TOKENS + (7,))
    assert match is not None and match.length == len(TOKENS), "the row itself looks sound"
    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"), pytest.raises(SnapshotInvalid, match="format"):
        tier.read(match, 0)
    assert tier.stats().quarantined == 1 and tier.lookup("ns", TOKENS + (7,)) == (None, None)
    assert "set aside" in caplog.text
    tier.close()


def test_the_torch_cache_over_an_old_tier_serves_cold(tmp_path) -> None:
    cache = torch_cache(ssd_dir=old_tier(tmp_path, "torch"), ssd_min_tokens=1)
    lease = cache.acquire("ns", TOKENS + (7,))
    assert (lease.tier, lease.cached_tokens) == (Tier.COLD, 0)
    assert cache.stats().ssd.quarantined == 1
    cache.release(lease)
    cache.close()
