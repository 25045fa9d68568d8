"""Daemon locks and liveness: one daemon per runtime dir and per data dir; stale files after kill -9 cleaned."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from zllm.control.pidfile import (
    DaemonAlreadyRunning,
    DaemonLocks,
    probe,
    read_pid,
    wait_until_released,
)


def paths(root):
    return root / "run" / "zllm.pid", root / "data", root / "run" / "zllm.sock"


def test_a_held_runtime_dir_is_alive_and_a_second_daemon_is_refused(short_dir) -> None:
    pid_file, data_dir, sock = paths(short_dir)
    locks = DaemonLocks.acquire(pid_file, data_dir, sock)
    try:
        assert probe(pid_file, sock) == probe(pid_file, sock, clean=False)
        state = probe(pid_file, sock)
        assert state.alive and not state.stale and state.pid == read_pid(pid_file) > 0
        with pytest.raises(DaemonAlreadyRunning) as refused:
            DaemonLocks.acquire(pid_file, short_dir / "other-data", sock)
        assert "already running" in refused.value.message and refused.value.hint == "stop it first: zllm stop"
    finally:
        locks.release()
    assert not pid_file.exists()
    assert probe(pid_file, sock).alive is False


def test_two_daemons_never_share_a_data_dir(short_dir) -> None:
    pid_file, data_dir, sock = paths(short_dir)
    locks = DaemonLocks.acquire(pid_file, data_dir, sock)
    other_pid, _, other_sock = paths(short_dir / "second")
    try:
        with pytest.raises(DaemonAlreadyRunning) as refused:
            DaemonLocks.acquire(other_pid, data_dir, other_sock)
        assert str(data_dir) in refused.value.message and "--data-dir" in refused.value.hint
        assert not other_pid.exists()  # the refused daemon left nothing behind
    finally:
        locks.release()
    DaemonLocks.acquire(other_pid, data_dir, other_sock).release()  # free again once the first is gone


def test_files_left_by_a_killed_daemon_are_stale_and_cleaned(short_dir) -> None:
    pid_file, data_dir, sock = paths(short_dir)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import socket, sys, time
        from pathlib import Path
        from zllm.control.pidfile import DaemonLocks
        DaemonLocks.acquire(Path({str(pid_file)!r}), Path({str(data_dir)!r}), Path({str(sock)!r}))
        s = socket.socket(socket.AF_UNIX); s.bind({str(sock)!r}); s.listen()
        print("ready", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert probe(pid_file, sock).alive and probe(pid_file, sock).pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert wait_until_released(pid_file, 5)
        assert pid_file.exists() and sock.exists()  # kill -9: nobody cleaned up
        seen = probe(pid_file, sock, clean=False)
        assert (seen.alive, seen.stale, seen.pid) == (False, True, holder.pid) and pid_file.exists()
        state = probe(pid_file, sock)
        assert (state.alive, state.stale, state.pid) == (False, True, holder.pid)
        assert not pid_file.exists() and not sock.exists()
        DaemonLocks.acquire(pid_file, data_dir, sock).release()  # a new daemon starts fine
    finally:
        holder.kill()
        holder.wait()


def test_a_socket_without_a_pid_file_is_stale(short_dir) -> None:
    pid_file, _, sock = paths(short_dir)
    sock.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
    state = probe(pid_file, sock)
    assert (state.alive, state.stale) == (False, True) and not sock.exists()
    assert probe(pid_file, sock) == probe(pid_file, sock) and not probe(pid_file, sock).stale


def test_a_new_daemon_replaces_a_dead_ones_socket(short_dir) -> None:
    pid_file, data_dir, sock = paths(short_dir)
    sock.parent.mkdir(parents=True)
    sock.write_text("")  # whatever a crash left
    locks = DaemonLocks.acquire(pid_file, data_dir, sock)
    try:
        assert not sock.exists()
    finally:
        locks.release()
