"""Launching `zllm serve` in the background for `zllm start`, and waiting until it answers "ready".

The child is `python -m zllm serve` in a new session (the terminal's Ctrl-C and hangup do not reach it), its
stdout and stderr appended to the log file (state_dir/zllm.log, rotated once past LOG_ROTATE_BYTES). Flags
given to `start` reach it as `ZLLM_*` variables, so they beat the config file exactly as flags do; they are
also remembered (state_dir/start-flags.json) so that `zllm restart` without flags starts the same daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from zllm import __version__
from zllm.config import SETTING_NAMES, Settings, env_name, parse_setting
from zllm.control.client import ControlClient
from zllm.control.protocol import DaemonStatus, DaemonUnreachable
from zllm.private_files import open_private, private_dir, write_private_text

LOG_ROTATE_BYTES = 20 << 20
START_FLAGS = "start-flags.json"


def flags_file(settings: Settings) -> Path:
    return settings.state_dir / START_FLAGS


def remember_flags(settings: Settings, flags: dict[str, object]) -> None:
    private_dir(settings.state_dir)  # the flags may hold the API key
    write_private_text(flags_file(settings), json.dumps({k: _env_value(v) for k, v in flags.items()}, indent=2) + "\n")


def remembered_flags(settings: Settings) -> dict[str, object]:
    try:
        data = json.loads(flags_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: parse_setting(k, str(v)) for k, v in data.items() if k in SETTING_NAMES}


def _env_value(value: object) -> str:
    if isinstance(value, Path):
        return str(value.expanduser().resolve())  # the daemon may be asked from another directory later
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class Launched:
    proc: subprocess.Popen
    log_file: Path
    log_offset: int  # where this start's lines begin in the log file

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


def launch(settings: Settings, flags: dict[str, object], command: list[str] | None = None) -> Launched:
    """`command` replaces `python -m zllm serve` (tests)."""
    env = {**os.environ, **{env_name(k): _env_value(v) for k, v in flags.items()}}
    private_dir(settings.state_dir)
    _rotate(settings.log_file)
    # the log names models, paths and errors about requests: this user's only
    with os.fdopen(open_private(settings.log_file, os.O_WRONLY | os.O_APPEND), "ab") as log:
        log.write(f"--- zllm {__version__} start {datetime.now().isoformat(timespec='seconds')} ---\n".encode())
        log.flush()
        offset = log.tell()
        proc = subprocess.Popen(command or [sys.executable, "-m", "zllm", "serve"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, env=env, start_new_session=True)
    return Launched(proc, settings.log_file, offset)


def _rotate(log_file: Path) -> None:
    try:
        if log_file.stat().st_size > LOG_ROTATE_BYTES:
            log_file.replace(log_file.with_name(log_file.name + ".1"))
    except FileNotFoundError:
        pass


class StartFailed(Exception):
    def __init__(self, reason: str, exit_code: int | None):
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


def wait_ready(launched: Launched, client: ControlClient, timeout: float,
               on_phase: Callable[[str], None] = lambda phase: None) -> DaemonStatus:
    """Poll the control socket until the launched daemon says "ready"; StartFailed if it exits first or
    `timeout` passes (it then keeps starting in the background)."""
    deadline = time.monotonic() + timeout
    phase = "starting"
    while time.monotonic() < deadline:
        code = launched.proc.poll()
        if code is not None:
            raise StartFailed(f"the daemon exited with status {code} while starting", code)
        try:
            status = client.status()
        except DaemonUnreachable:
            status = None
        if status is not None and status.pid == launched.proc.pid:
            if status.phase != phase:
                phase = status.phase
                on_phase(phase)
            if phase == "ready":
                return status
        time.sleep(0.1)
    raise StartFailed(f"the daemon was not ready after {timeout:.0f}s (it was {phase})", None)
