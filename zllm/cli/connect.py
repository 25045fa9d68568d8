"""The CLI's way to the daemon: one `ControlClient` per command, exit codes, version skew on stderr.

    with daemon_errors():                 # DaemonUnreachable → exit 3, ControlError → exit 1 (2 if internal)
        status = connect().status()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from zllm import __version__
from zllm.cli.output import err, fail
from zllm.config import Settings, load_settings
from zllm.control.client import ControlClient
from zllm.control.pidfile import probe
from zllm.control.protocol import INTERNAL, ControlError, DaemonUnreachable
from zllm.errors import ZllmError

EXIT_USER = 1  # the user can fix it: a bad flag, a missing model, a setting out of range
EXIT_INTERNAL = 2  # a bug: please report it
EXIT_UNREACHABLE = 3  # no daemon answers on the control socket

EXIT_CODES_HELP = ("Exit status: 0 ok, 1 a failure you can fix (the message says how), 2 an internal error, "
                   "3 no daemon answers on the control socket.")


def settings_or_fail(**overrides: object) -> Settings:
    try:
        return load_settings(**overrides)
    except ZllmError as exc:
        fail(exc.message, hint=exc.hint, code=EXIT_USER)


def connect(settings: Settings | None = None, *, timeout: float = 10.0) -> ControlClient:
    settings = settings or settings_or_fail()
    return ControlClient(settings.control_socket, timeout=timeout, on_version=warn_on_skew)


def warn_on_skew(daemon_version: str) -> None:
    if daemon_version != __version__:
        err.print(f"[yellow]warning[/]: the daemon runs zllm {daemon_version}, this CLI is zllm {__version__}")
        err.print("[bold cyan]hint[/]: restart it to run this version: zllm restart")


@contextmanager
def daemon_errors(settings: Settings | None = None) -> Iterator[None]:
    """Turns the control client's errors into `error:` / `hint:` lines and the documented exit codes."""
    try:
        yield
    except DaemonUnreachable as exc:
        settings = settings or settings_or_fail()
        state = probe(settings.pid_file, settings.control_socket)
        if state.stale:
            err.print(f"removed a stale pid file and socket left by a daemon that died (pid {state.pid})")
        if state.alive:
            fail(f"the zllm daemon (pid {state.pid}) is running but its control socket does not answer",
                 cause=exc.message, hint="see `zllm logs`; `zllm restart` starts it afresh", code=EXIT_UNREACHABLE)
        fail(exc.message, hint=exc.hint, code=EXIT_UNREACHABLE)
    except ControlError as exc:
        fail(exc.message, hint=exc.hint, code=EXIT_INTERNAL if exc.code == INTERNAL else EXIT_USER)
    except ZllmError as exc:
        fail(exc.message, hint=exc.hint, code=EXIT_USER)


@dataclass(frozen=True)
class RunningDaemon:
    """What a running daemon serves, as `zllm claude` / `zllm codex` need it."""

    host: str  # the bind address (a wildcard is dialled as loopback by the caller)
    port: int
    model: str
    context_length: int | None
    prefill_tokens_per_s: float | None = None  # measured (control/prefill_rate.py); None: not yet


def running_daemon(settings: Settings, timeout: float = 2.0) -> RunningDaemon | None:
    """The running, ready daemon's own answer; None when none answers (the caller falls back to settings)."""
    client = ControlClient(settings.control_socket, timeout=timeout, on_version=warn_on_skew)
    try:
        status = client.status()
        models = client.ps() if status.phase == "ready" else []
    except ZllmError:
        return None
    if status.phase != "ready" or not models:
        return None
    return RunningDaemon(host=status.host, port=status.port, model=models[0].name,
                         context_length=models[0].context_length or None,
                         prefill_tokens_per_s=models[0].prefill_tokens_per_s)
