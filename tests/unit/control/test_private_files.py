"""What zllm keeps about requests is 0600 in 0700 directories whatever the umask, and older, wider files are
narrowed at start: the helper, the control socket, the Responses store, the log and flags, the daemon's sweep."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zllm import daemon
from zllm.cli import spawn
from zllm.config import Settings
from zllm.control.server import ControlServer
from zllm.private_files import open_private, private_dir, tighten_tree
from zllm.store import ResponseStore


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def loose_umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_is_0700_new_or_existing(tmp_path, loose_umask) -> None:
    assert mode(private_dir(tmp_path / "a" / "new")) == 0o700
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o777)
    os.chmod(wide, 0o755)
    assert mode(private_dir(wide)) == 0o700


def test_open_private_creates_0600_and_narrows_an_existing_file(tmp_path, loose_umask) -> None:
    os.close(open_private(tmp_path / "new", os.O_WRONLY))
    old = tmp_path / "old"
    old.write_text("x")
    os.chmod(old, 0o644)
    os.close(open_private(old, os.O_WRONLY | os.O_APPEND))
    assert (mode(tmp_path / "new"), mode(old), old.read_text()) == (0o600, 0o600, "x")


def test_tighten_tree_narrows_everything_below(tmp_path) -> None:
    nested = tmp_path / "kv" / "blobs"
    nested.mkdir(parents=True)
    (nested / "0001.safetensors").write_bytes(b"k")
    (tmp_path / "kv" / "index.sqlite").write_bytes(b"i")
    for path in (tmp_path / "kv", nested, nested / "0001.safetensors", tmp_path / "kv" / "index.sqlite"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    tighten_tree(tmp_path / "kv")
    assert {mode(p) for p in (tmp_path / "kv", nested)} == {0o700}
    assert {mode(p) for p in (nested / "0001.safetensors", tmp_path / "kv" / "index.sqlite")} == {0o600}


def test_control_socket_is_born_private(short_dir, loop_thread, loose_umask, monkeypatch) -> None:
    """With the narrowing after bind() made a no-op, the socket is still closed to group and others: there is no
    window between bind() and chmod(). Its directory, found 0755, is narrowed to 0700."""
    run_dir = short_dir / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o755)
    monkeypatch.setattr("zllm.control.server.tighten", lambda path: None)
    server = ControlServer(run_dir / "zllm.sock", version="1", methods={})
    loop_thread.run(server.start())
    try:
        assert mode(server.path) & 0o077 == 0 and stat.S_ISSOCK(os.lstat(server.path).st_mode)
        assert mode(run_dir) == 0o700
    finally:
        loop_thread.run(server.close())


def test_responses_store_and_its_wal_are_0600(tmp_path, loose_umask) -> None:
    state = tmp_path / "state"
    store = ResponseStore(state / "responses.sqlite3")
    try:
        store.count()
        files = sorted(state.iterdir())
        assert [f.name for f in files] == ["responses.sqlite3", "responses.sqlite3-shm", "responses.sqlite3-wal"]
        assert {mode(f) for f in files} == {0o600} and mode(state) == 0o700
    finally:
        store.close()


def test_responses_store_left_wide_by_an_older_zllm_is_narrowed(tmp_path) -> None:
    ResponseStore(tmp_path / "r.sqlite3").close()
    os.chmod(tmp_path / "r.sqlite3", 0o644)
    ResponseStore(tmp_path / "r.sqlite3").close()
    assert mode(tmp_path / "r.sqlite3") == 0o600


def test_start_log_and_remembered_flags_are_private(tmp_path, loose_umask) -> None:
    settings = Settings(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run")
    spawn.launch(settings, {}, command=["true"]).proc.wait()
    spawn.remember_flags(settings, {"api_key": "secret"})
    assert mode(settings.log_file) == 0o600 and mode(spawn.flags_file(settings)) == 0o600
    assert mode(settings.state_dir) == 0o700


def test_daemon_start_narrows_what_an_older_zllm_left_readable(tmp_path) -> None:
    settings = Settings(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run",
                        cache_dir=tmp_path / "cache")
    blobs = settings.ssd_cache_dir / "blobs"
    blobs.mkdir(parents=True)
    settings.state_dir.mkdir()
    wide = [settings.state_dir / "responses.sqlite3", settings.log_file, blobs / "1.safetensors",
            settings.ssd_cache_dir / "index.sqlite"]
    for path in wide:
        path.write_bytes(b"x")
        os.chmod(path, 0o644)
    for directory in (settings.state_dir, settings.ssd_cache_dir, blobs):
        os.chmod(directory, 0o755)
    daemon.make_private(settings)
    assert {mode(p) for p in wide} == {0o600}
    assert {mode(d) for d in (settings.state_dir, settings.runtime_dir, settings.ssd_cache_dir, blobs)} == {0o700}


def test_daemon_start_leaves_other_files_in_a_shared_state_dir_alone(tmp_path) -> None:
    """A state dir pointed at a shared place: only zllm's own files are narrowed."""
    settings = Settings(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run",
                        cache_dir=tmp_path / "cache")
    settings.state_dir.mkdir()
    script = settings.state_dir / "someone-elses-script.sh"
    script.write_text("#!/bin/sh\n")
    os.chmod(script, 0o755)
    daemon.make_private(settings)
    assert mode(script) == 0o755
