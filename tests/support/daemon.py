"""Real daemons for integration tests (no mocks between SDK and engine).

`Daemon`: a `zllm serve` process in the foreground on a real port, its stderr in a file.
`CliEnv`: an isolated environment (data, state, cache, runtime dirs, config file, port) for driving the real
`zllm` CLI — `zllm start` and friends — in subprocesses or under pexpect.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from zllm.control.client import ControlClient
from zllm.control.pidfile import wait_until_released

_LIVE: set[subprocess.Popen] = set()  # daemons not yet stopped: killed when the test process exits


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, even by a timeout's os._exit that skips atexit."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """Runs `python -m zllm serve ...`; stderr goes to a file the test can read (`log()`)."""

    def __init__(self, data_dir: Path, model: str | None, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="zllm-daemon-", suffix=".log", delete=False)
        # state and cache dirs default to this daemon's own temp dir: tests never touch the user's
        self.scratch = Path(tempfile.mkdtemp(prefix="zllm-daemon-"))
        # a restart test hands both daemons one cache dir: one install, so one state dir too (its namespace
        # secret is what keeps the SSD tier's namespaces across the restart)
        shared_cache = (env or {}).get("ZLLM_CACHE_DIR")
        state_dir = Path(shared_cache).parent / "state" if shared_cache else self.scratch / "state"
        full_env = {
            **os.environ,
            "ZLLM_DATA_DIR": str(data_dir),
            "ZLLM_STATE_DIR": str(state_dir),
            "ZLLM_CACHE_DIR": str(self.scratch / "cache"),
            # the control socket and pid file: never the user's (and short enough for a unix socket path)
            "ZLLM_RUNTIME_DIR": str(self.scratch / "run"),
            "ZLLM_THREADS": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zllm", "serve", *(["--model", model] if model else []), "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=self._log, env=full_env, preexec_fn=_die_with_parent,
        )
        _LIVE.add(self.proc)

    def log(self) -> str:
        return Path(self._log.name).read_text()

    def logged(self, text: str, timeout: float = 10.0) -> bool:
        """Whether `text` shows in the log within `timeout` (a finish line is logged once the terminal state is
        kept, just after the response went out)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    @property
    def control_socket(self) -> Path:
        return self.scratch / "run" / "zllm.sock"

    def control(self, timeout: float = 10.0) -> ControlClient:
        return ControlClient(self.control_socket, timeout=timeout)

    def wait_ready(self, timeout: float = 120.0) -> Daemon:
        """Returns once /health answers; a daemon that never gets there is stopped before the error is raised."""
        try:
            return self._wait_ready(timeout)
        except BaseException:  # a timeout (or pytest-timeout's interrupt) must not leak the process
            self.stop(signal.SIGKILL, timeout=5)
            raise

    def _wait_ready(self, timeout: float) -> Daemon:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"daemon not ready after {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _LIVE.discard(self.proc)
        return self.proc.returncode


class CliEnv:
    """Everything `zllm` reads, pointed at fresh temp dirs: the user's store, config and daemon stay untouched."""

    def __init__(self, data_dir: Path, **extra: str):
        self.root = Path(tempfile.mkdtemp(prefix="zllm-cli-"))  # short: the socket path must fit sun_path
        self.port = free_port()
        self.config_file = self.root / "config.toml"
        self.config_file.write_text("")
        self.env = {
            **os.environ,
            "ZLLM_DATA_DIR": str(data_dir),
            "ZLLM_STATE_DIR": str(self.root / "state"),
            "ZLLM_CACHE_DIR": str(self.root / "cache"),
            "ZLLM_RUNTIME_DIR": str(self.root / "run"),
            "ZLLM_CONFIG": str(self.config_file),
            "ZLLM_PORT": str(self.port),
            "ZLLM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "NO_COLOR": "1",
            "COLUMNS": "200",  # rich wraps long error lines at the console width; tests match whole lines
            **extra,
        }
        self.env.pop("ZLLM_API_KEY", None)
        self.base_url = f"http://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.root / "run" / "zllm.pid"

    @property
    def control_socket(self) -> Path:
        return self.root / "run" / "zllm.sock"

    @property
    def log_file(self) -> Path:
        return self.root / "state" / "zllm.log"

    def control(self, timeout: float = 10.0) -> ControlClient:
        return ControlClient(self.control_socket, timeout=timeout)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "zllm", *args]

    def run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """`zllm ARGS` to completion, stdout and stderr captured apart (stdout is data, stderr is for people)."""
        return subprocess.run(self.command(*args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def daemon_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        self.kill_daemon()
        shutil.rmtree(self.root, ignore_errors=True)

    def kill_daemon(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Best effort, for teardown: the daemon is not our child (it runs in its own session)."""
        pid = self.daemon_pid()
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        wait_until_released(self.pid_file, timeout)  # its lock, not its pid: a zombie still has a pid
