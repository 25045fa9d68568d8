"""SSD-tier damage found at startup, through a real daemon: a directory where a blob should be, an index that is
garbage, from a newer zllm, or locked by another process. Each once kept the daemon from starting (or would
take over an index in use); now it starts, serves the conversation cold with the cold answer, and says what
it set aside in its log and in `zllm cache stats` (the control socket's cache.stats). Index rows that disagree
with their blob (a forged size, token blob or generation) and a stray file named past sqlite's generations were
once trusted, or stopped every later write: now each is counted, logged and kept aside, and writes go on.
The whole matrix, at open and at read and on both backends, is tests/unit/kvcache/test_cache_contract.py."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon

SYSTEM = "You are a coding agent. Follow the repository's conventions. " * 12
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Add a test."}]
OTHER = [{"role": "system", "content": "Answer as a patient maintainer would. " * 12},
         {"role": "user", "content": "Explain the module."}]
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("UPDATE meta SET value = value")
print("locked", flush=True)
sys.stdin.read()
"""


def start(data_dir: Path, cache_dir: Path) -> Daemon:
    env = {"ZLLM_CACHE_DIR": str(cache_dir), "ZLLM_SSD_MIN_TOKENS": "1"}
    return Daemon(data_dir, TINY, "--context-length", "1024", env=env).wait_ready()


def ask(daemon: Daemon, messages: list[dict] = MESSAGES) -> tuple[str, int]:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="alice", max_retries=0, timeout=60)
    completion = client.chat.completions.create(model=TINY, messages=messages, temperature=0, max_tokens=12)
    return completion.choices[0].message.content, completion.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def pristine(tiny_data_dir, tmp_path_factory) -> tuple[Path, str]:
    """A cache dir whose SSD tier holds the conversation's snapshot, and the answer it got cold."""
    cache_dir = tmp_path_factory.mktemp("pristine") / "cache"
    daemon = start(tiny_data_dir, cache_dir)
    try:
        answer, cached = ask(daemon)
        assert cached == 0
    finally:
        daemon.stop()  # SIGTERM: the snapshot write finishes before exit
    assert len(list((cache_dir / "kv" / "blobs").iterdir())) == 1
    return cache_dir, answer


def blob_to_directory(kv: Path) -> None:
    (blob,) = (kv / "blobs").iterdir()
    blob.unlink()
    (blob / "inside").mkdir(parents=True)


def garbage_index(kv: Path) -> None:
    (kv / "index.sqlite").write_bytes(b"\x00not a database\xff" * 500)


def future_index(kv: Path) -> None:
    db = sqlite3.connect(kv / "index.sqlite")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()


DAMAGE = {"blob-is-a-directory": blob_to_directory, "garbage-index": garbage_index, "future-index": future_index}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", [*DAMAGE, "locked-index"])
def test_the_daemon_starts_over_damage_and_serves_cold(tiny_data_dir, pristine, tmp_path, damage) -> None:
    cache_dir = tmp_path / "cache"
    shutil.copytree(pristine[0], cache_dir)
    kv = cache_dir / "kv"
    locker = None
    if damage == "locked-index":
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(kv / "index.sqlite")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert locker.stdout.readline().strip() == "locked"
    else:
        DAMAGE[damage](kv)
    try:
        daemon = start(tiny_data_dir, cache_dir)
        try:
            answer, cached = ask(daemon)
            stats = daemon.control().cache_stats()
            log = daemon.log()
        finally:
            daemon.stop()
    finally:
        if locker is not None:
            locker.stdin.close()
            locker.wait(timeout=10)
    assert (answer, cached) == (pristine[1], 0), "served from the damaged tier, or a different answer"
    assert "Traceback" not in log
    if damage == "locked-index":
        assert "locked" in stats["ssd_off"] and "SSD tier off" in log
        assert (kv / "index.sqlite").is_file(), "an index in use by another process is left where it is"
    elif damage == "blob-is-a-directory":
        assert stats["ssd_quarantined"] == 1 and "set aside as damaged" in log
        assert any(p.is_dir() for p in (kv / "quarantine").iterdir()), "the directory is kept aside, not deleted"
    else:
        assert stats["ssd_index_set_aside"] == 1 and "set aside, starting empty" in log
        assert any(p.name.startswith("index.sqlite.") for p in (kv / "quarantine").iterdir())


MAX_SQLITE = (1 << 63) - 1


def forge_row(kv: Path, assignments: str, *params) -> None:
    """Edit the snapshot's index row, its blob untouched: a forged or stale row."""
    db = sqlite3.connect(kv / "index.sqlite")
    db.execute(f"UPDATE snapshots SET {assignments}", params)
    db.commit()
    db.close()


def forge_generation(kv: Path) -> None:
    (blob,) = (kv / "blobs").iterdir()
    forge_row(kv, "generation = ?", MAX_SQLITE)
    blob.rename(blob.with_name(f"{MAX_SQLITE:016x}.zkv"))


def stray_file(kv: Path) -> None:
    (blob,) = (kv / "blobs").iterdir()
    (kv / "blobs" / "ffffffffffffffff.zkv").write_bytes(blob.read_bytes())


# damage, the reason the log gives once, (ssd_quarantined, ssd_strays), what quarantine/ keeps (None: the blob)
FORGERIES = {
    "huge-size-row": (lambda kv: forge_row(kv, "bytes = ?", MAX_SQLITE), "the index says 9223372036854775807",
                      (1, 0), None),
    "oversized-token-row": (lambda kv: forge_row(kv, "tokens = zeroblob(?)", 4 * (1 << 21) + 4),
                            "over 2097152 tokens", (1, 0), None),
    "forged-generation": (forge_generation, "generation 9223372036854775807 is out of bounds", (1, 1),
                          f"{MAX_SQLITE:016x}"),
    "stray-max-generation": (stray_file, "blobs/ffffffffffffffff.zkv", (0, 1), "ffffffffffffffff"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("forgery", FORGERIES)
def test_the_daemon_sets_forged_rows_and_stray_files_aside_and_keeps_writing(tiny_data_dir, pristine, tmp_path,
                                                                             forgery) -> None:
    cache_dir = tmp_path / "cache"
    shutil.copytree(pristine[0], cache_dir)
    kv = cache_dir / "kv"
    (blob,) = (kv / "blobs").iterdir()
    damage, reason, counts, kept_as = FORGERIES[forgery]
    damage(kv)
    daemon = start(tiny_data_dir, cache_dir)
    try:
        stats = daemon.control().cache_stats()  # found at open
        answer, cached = ask(daemon)
        ask(daemon, OTHER)  # a new conversation: its snapshot must be written (the torch tier once stopped writing)
        deadline = time.monotonic() + 30
        while (snapshots := daemon.control().cache_stats()["ssd_snapshots"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        log = daemon.log()
    finally:
        daemon.stop()
    stray = forgery == "stray-max-generation"  # a stray is no snapshot: the conversation's own stays in service
    assert (stats["ssd_quarantined"], stats["ssd_strays"], stats["ssd_snapshots"]) == (*counts, int(stray))
    assert log.count(reason) == 1, "logged once, with the reason"
    assert any(p.name.startswith(kept_as or blob.stem) for p in (kv / "quarantine").iterdir()), "kept aside"
    assert answer == pristine[1] and (stray or cached == 0), "served from a row that was set aside"
    assert snapshots >= 2, "writes stopped"
    assert "Traceback" not in log and "writing snapshot" not in log
