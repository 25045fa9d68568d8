"""The test daemon helper never leaks a `zllm serve` process: not when it fails to come up in time, and not
when the test process dies without running its cleanup (pytest-timeout's thread method ends in os._exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon

REPO = Path(__file__).resolve().parents[2]


def test_a_daemon_that_is_not_ready_in_time_is_stopped(tiny_data_dir) -> None:
    daemon = Daemon(tiny_data_dir, TINY)
    with pytest.raises(TimeoutError):
        daemon.wait_ready(timeout=0.01)
    assert daemon.proc.poll() is not None


def test_a_serving_daemon_dies_with_the_test_process_that_started_it(tiny_data_dir) -> None:
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from tests.support.daemon import Daemon
        daemon = Daemon(Path({str(tiny_data_dir)!r}), {TINY!r}).wait_ready(timeout=240)
        print(daemon.proc.pid, flush=True)
        os._exit(1)  # no atexit, no finally
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the daemon outlived the process that started it")
