"""Ctrl-C ends a follow even when the CLI inherited SIGINT as ignored (started by `cmd &` from a script, as a CI
runner may start the suite): Python then installs no KeyboardInterrupt handler, and without cli/interrupts.py
`zllm logs -f` / `zllm trace` would wait forever. `logs -f` over a log file needs no daemon."""

from __future__ import annotations

import signal
import sys
import time

import pexpect

from tests.support.daemon import CliEnv


def test_ctrl_c_ends_logs_follow_whatever_sigint_the_cli_inherited(tmp_path) -> None:
    cli = CliEnv(tmp_path / "data")
    try:
        cli.log_file.parent.mkdir(parents=True, exist_ok=True)
        cli.log_file.write_text("2026-12-03 08:00:00 INFO zllm.daemon: shutting down\n")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the spawned CLI inherits
        try:
            child = pexpect.spawn(sys.executable, ["-m", "zllm", "logs", "-f"], env=cli.env, encoding="utf-8",
                                  timeout=60)
        finally:
            signal.signal(signal.SIGINT, previous)
        child.expect("shutting down")
        time.sleep(0.5)  # into the follow loop
        child.sendintr()
        child.expect(pexpect.EOF, timeout=20)
        child.close()
        assert child.exitstatus == 0
    finally:
        cli.close()
