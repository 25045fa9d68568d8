"""A real `zllm serve` process on a real port, for integration tests (no mocks between SDK and engine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


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
        full_env = {
            **os.environ,
            "ZLLM_DATA_DIR": str(data_dir),
            "ZLLM_STATE_DIR": str(self.scratch / "state"),
            "ZLLM_CACHE_DIR": str(self.scratch / "cache"),
            "ZLLM_THREADS": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zllm", "serve", *(["--model", model] if model else []), "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=self._log, env=full_env,
        )

    def log(self) -> str:
        return Path(self._log.name).read_text()

    def wait_ready(self, timeout: float = 120.0) -> "Daemon":
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
        return self.proc.returncode
