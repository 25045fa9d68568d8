"""The SSD tiers' shared row check (soundness.py) in isolation: generation bounds on file names, and a token
count the blob cannot hold. The damage matrix on both backends is tests/unit/kvcache/test_cache_contract.py."""

import logging
import sqlite3

from tests.unit.kvcache.conftest import random_tokens, torch_job, torch_store
from zllm.kvcache.soundness import GENERATION_LIMIT, generation_of
from zllm.kvcache.ssd_index import pack_tokens

SUFFIXES = (".zkv", ".tmp")


def test_a_generation_comes_from_a_file_name_only_within_bounds() -> None:
    assert generation_of("000000000000002a.zkv", SUFFIXES) == 42
    assert generation_of("000000000000002a.tmp", SUFFIXES) == 42
    assert generation_of(f"{GENERATION_LIMIT - 1:016x}.zkv", SUFFIXES) == GENERATION_LIMIT - 1
    for stray in (f"{GENERATION_LIMIT:016x}.zkv", "ffffffffffffffff.zkv",
                  "7fffffffffffffff.zkv", "000000000000002A.zkv", "2a.zkv",
                  "000000000000002a.seqstate", "000000000000002a.safetensors", "000000000000002a", "notes.txt",
                  "+00000000000002a.tmp"):
        assert generation_of(stray, SUFFIXES) is None, stray
    assert generation_of("000000000000002a.seqstate", (".seqstate",)) == 42


def test_a_row_claiming_more_tokens_than_its_blob_holds_is_set_aside(tmp_path, caplog) -> None:
    directory = tmp_path / "kv"
    store = torch_store(directory)
    tokens = random_tokens(100)
    row = store.commit(torch_job("snap", tokens))
    store.close()
    db = sqlite3.connect(directory / "index.sqlite")  # size and generation agree with the blob, the count not
    db.execute("UPDATE snapshots SET tokens = ?, prompt_len = 0", (pack_tokens(tokens * 40),))
    db.commit()
    db.close()
    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
        store = torch_store(directory)
    assert store.snapshots() == [] and store.stats().quarantined == 1
    assert f"cannot hold {100 * 40} tokens" in caplog.text
    assert [p.name.split(".")[0] for p in (directory / "quarantine").iterdir()] == [row.blob_name.split(".")[0]]
    store.check_integrity()
    store.close()
