"""The vLLM server's keeper: runs it in its own process group and takes vLLM's whole process group down with the daemon.

    python -m zllm.engine.vllm.watchdog VLLM_PYTHON ARGS...     (stdin: a pipe from the daemon, never written)

vLLM starts children of its own (the engine core, workers); none of them may outlive zllm, whichever way the
daemon ends — `zllm stop`, a crash, a `kill -9`. The daemon starts this keeper as a new session (so a Ctrl-C
reaches it only through the daemon) and holds the write end of its stdin: when the daemon dies the pipe closes
on its own, the keeper reads EOF and ends vLLM's group (SIGTERM, then SIGKILL after a grace). When vLLM exits on
its own, the keeper exits with vLLM's status, which the daemon reports. Stdlib only: it runs on zllm's Python.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 10.0
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: SIGTERM this keeper if the daemon goes (belt to the pipe's braces)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def end_group(server: subprocess.Popen) -> None:
    """SIGTERM to the group (vLLM and its children), SIGKILL to whatever is left after the grace."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and server.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)  # vLLM's own children end after its front process
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    # plain flags, polled: the SIGTERM handler runs inside whatever the main thread is doing, and an Event's
    # set() from there deadlocks against that thread's own wait() on the same lock (seen: an orphaned vLLM)
    stop = {"daemon_gone": False, "terminated": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(terminated=True))  # before the death signal is armed
    _die_with_parent()
    # its own process group (vLLM's children join it): one killpg ends them all, and not this keeper
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, process_group=0)

    def watch_daemon() -> None:
        while sys.stdin.buffer.read(1):  # nothing is ever written: EOF is the daemon gone (or stopping us)
            pass
        stop["daemon_gone"] = True

    threading.Thread(target=watch_daemon, daemon=True).start()
    while not (stop["daemon_gone"] or stop["terminated"]):
        if server.poll() is not None:
            code = server.returncode
            end_group(server)  # its children, if any remain
            return code if code >= 0 else 128 - code
        time.sleep(0.2)
    end_group(server)
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    # not sys.exit: the thread blocked reading stdin would abort the interpreter's shutdown (SIGABRT)
    os._exit(status)
