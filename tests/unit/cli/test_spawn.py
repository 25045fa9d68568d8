"""`zllm start`'s launcher: flags handed to the child and remembered for restart, the log file, and waiting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zllm.cli import spawn
from zllm.config import load_settings
from zllm.control.client import ControlClient


@pytest.fixture()
def settings(tmp_path):
    return load_settings({"ZLLM_STATE_DIR": str(tmp_path / "state"), "ZLLM_RUNTIME_DIR": str(tmp_path / "run"),
                          "ZLLM_CONFIG": str(_empty(tmp_path / "config.toml"))})


def _empty(path: Path) -> Path:
    path.write_text("")
    return path


def test_flags_are_remembered_typed_for_restart(settings, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spawn.remember_flags(settings, {"model": "tiny", "port": 12000, "ssd_cache": False, "data_dir": Path("d")})
    assert spawn.remembered_flags(settings) == {"model": "tiny", "port": 12000, "ssd_cache": False,
                                                "data_dir": tmp_path / "d"}  # resolved where start ran
    spawn.flags_file(settings).write_text('{"port": 1, "bogus": 2}')
    assert spawn.remembered_flags(settings) == {"port": 1}  # unknown names from another version are dropped
    spawn.flags_file(settings).write_text("not json")
    assert spawn.remembered_flags(settings) == {}


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_that_dies_fails_the_start_with_its_own_log_lines(settings) -> None:
    settings.state_dir.mkdir(parents=True)
    settings.log_file.write_text("an older run's line\n")
    launched = spawn.launch(settings, {"port": 12345}, child(
        "import os, sys; print('error: port is', os.environ['ZLLM_PORT'], file=sys.stderr); sys.exit(1)"))
    with pytest.raises(spawn.StartFailed) as failed:
        spawn.wait_ready(launched, ControlClient(settings.control_socket, timeout=0.2), timeout=30)
    assert failed.value.exit_code == 1 and "exited with status 1" in failed.value.reason
    assert launched.log_tail() == "error: port is 12345"
    assert settings.log_file.read_text().startswith("an older run's line\n--- zllm ")  # appended, with a header


def test_a_child_that_never_answers_times_out(settings) -> None:
    launched = spawn.launch(settings, {}, child("import time; time.sleep(30)"))
    try:
        with pytest.raises(spawn.StartFailed) as failed:
            spawn.wait_ready(launched, ControlClient(settings.control_socket, timeout=0.2), timeout=0.5)
        assert failed.value.exit_code is None and "not ready after" in failed.value.reason
    finally:
        launched.proc.kill()
        launched.proc.wait()


def test_a_big_log_is_rotated_once(settings, monkeypatch) -> None:
    monkeypatch.setattr(spawn, "LOG_ROTATE_BYTES", 10)
    settings.state_dir.mkdir(parents=True)
    settings.log_file.write_text("x" * 20)
    spawn.launch(settings, {}, child("pass")).proc.wait()
    assert settings.log_file.with_name("zllm.log.1").read_text() == "x" * 20
    assert settings.log_file.read_text().startswith("--- zllm ")
