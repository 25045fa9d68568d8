"""What `zllm serve` refuses in its first second, before any weights load: a busy port, a taken store."""

from __future__ import annotations

import socket

import pytest

from zllm import daemon
from zllm.config import load_settings
from zllm.control.pidfile import DaemonAlreadyRunning, DaemonLocks
from zllm.errors import ConfigError


def test_a_busy_port_is_a_config_error_with_a_hint() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as taken:
            daemon.check_port_free("127.0.0.1", port)
    assert f"cannot listen on 127.0.0.1:{port}" in taken.value.message and "--port" in taken.value.hint
    daemon.check_port_free("127.0.0.1", port)  # free again once closed


def test_run_refuses_a_store_another_daemon_holds_before_pulling(short_dir, monkeypatch) -> None:
    (short_dir / "none.toml").write_text("")
    env = {"ZLLM_DATA_DIR": str(short_dir / "data"), "ZLLM_CONFIG": str(short_dir / "none.toml")}
    first = load_settings(env | {"ZLLM_RUNTIME_DIR": str(short_dir / "a")})
    second = load_settings(env | {"ZLLM_RUNTIME_DIR": str(short_dir / "b")}, model="never-pulled")
    monkeypatch.setattr(daemon, "resolve_model", lambda *a, **k: pytest.fail("pulled before checking the lock"))
    locks = DaemonLocks.acquire(first.pid_file, first.data_dir, first.control_socket)
    try:
        with pytest.raises(DaemonAlreadyRunning):
            daemon.run(second)
    finally:
        locks.release()
    assert not second.pid_file.exists()  # the refused daemon left nothing behind
