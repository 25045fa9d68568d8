"""`zllm start / stop / restart / status / logs`: the background daemon's life, from the command line.

    $ zllm start -m smollm2          # pulls the model if needed, starts `zllm serve` in the background,
    zllm started (pid 4242): smollm2 on http://127.0.0.1:11435/v1      # returns once it answers "ready"
    $ zllm status --json             # DaemonStatus as JSON on stdout; exit 3 when none runs
    $ zllm logs -f                   # the daemon's log lines (over the socket; the log file when it is down)
    $ zllm stop                      # SIGTERM, then wait for the pid file's lock to be let go

`start` and `restart` take every `serve` option (defined once, in serve.py).
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import time
from pathlib import Path  # noqa: F401  (serve's annotations are evaluated in this module)

import typer

from zllm.cli import serve as serve_command
from zllm.cli.connect import (
    EXIT_UNREACHABLE,
    EXIT_USER,
    connect,
    daemon_errors,
    settings_or_fail,
)
from zllm.cli.interrupts import ctrl_c_ends_the_follow
from zllm.cli.output import err, fail, fail_with, print_json
from zllm.cli.spawn import (
    StartFailed,
    launch,
    remember_flags,
    remembered_flags,
    wait_ready,
)
from zllm.cli.table import write_fields
from zllm.cli.units import human_duration
from zllm.config import Settings
from zllm.control.pidfile import PidState, probe, wait_until_released
from zllm.control.protocol import DaemonStatus, DaemonUnreachable, PrefillProgress
from zllm.errors import ZllmError


def register(app: typer.Typer) -> None:
    app.command("start")(start)
    app.command("stop")(stop)
    app.command("restart")(restart)
    app.command("status")(status)
    app.command("logs")(logs)


def _with_serve_options(command):
    """Give `command` every option of `zllm serve` after its own; they arrive in its **serve_options."""
    own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
    borrowed = list(inspect.signature(serve_command.serve).parameters.values())
    command.__signature__ = inspect.Signature(own + borrowed)
    command.__annotations__ = {**serve_command.serve.__annotations__, **command.__annotations__}
    return command


# ---------------------------------------------------------------------- start / stop / restart


@_with_serve_options
def start(
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the daemon to become ready."),
    **serve_options,
) -> None:
    """Start the daemon in the background (takes every `serve` option); returns once it is ready."""
    flags = {k: v for k, v in serve_options.items() if v is not None}
    _start(flags, timeout)


def _start(flags: dict[str, object], timeout: float) -> None:
    if flags.get("api_keys_file"):  # the daemon (and a later restart) may run from another directory
        flags = {**flags, "api_keys_file": serve_command.absolute_path(str(flags["api_keys_file"]))}
    settings = settings_or_fail(**flags)
    state = _probe(settings)
    if state.alive:
        err.print(f"zllm is already running (pid {state.pid})")
        err.print("[bold cyan]hint[/]: `zllm restart` applies new settings")
        return
    served = _pull_if_missing(settings)
    flags = {**flags, "model": served}  # the store name: the daemon must not resolve a path a second time
    launched = launch(settings, flags)
    client = connect(settings, timeout=2.0)
    try:
        with Spinner("starting the daemon") as show:
            ready = wait_ready(launched, client, timeout, on_phase=lambda phase: show(f"daemon is {phase}"))
    except StartFailed as exc:
        tail = launched.log_tail()
        if tail:
            err.print(tail, markup=False, highlight=False)
        fail(exc.reason, hint=f"the whole log: {settings.log_file}", code=EXIT_USER)
    except KeyboardInterrupt:
        fail("stopped waiting; the daemon goes on starting in the background", hint="zllm status", code=130)
    remember_flags(settings, flags)  # only flags that started a daemon are worth starting again
    err.print(f"[green]zllm started[/] (pid {ready.pid}): {ready.model} on {ready.http_url}")


def _pull_if_missing(settings: Settings) -> str:
    """The model's store name, pulled first (progress on stderr) when the store lacks it; refuses settings the
    daemon would refuse (binding beyond loopback without a key) before anything is pulled or spawned."""
    from zllm.daemon import check_exposure, resolve_model
    from zllm.models import RichPullProgress

    try:
        check_exposure(settings)
        with RichPullProgress(console=err) as progress:
            return resolve_model(settings, progress).name
    except ZllmError as exc:
        fail_with(exc)


def stop(
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for a graceful shutdown."),
    force: bool = typer.Option(False, "--force", help="Kill the daemon (SIGKILL) if it has not stopped in time."),
) -> None:
    """Stop the background daemon: SIGTERM (in-flight requests get a short grace), then wait for it to exit."""
    settings = settings_or_fail()
    _stop(settings, timeout, force)


def _stop(settings: Settings, timeout: float, force: bool) -> bool:
    """True if a daemon was stopped, False if none was running."""
    state = _probe(settings)
    if not state.alive:
        err.print("zllm is not running")
        return False
    if state.pid is None:
        fail("the daemon has not written its pid yet", hint="try again in a moment", code=EXIT_USER)
    os.kill(state.pid, signal.SIGTERM)
    with Spinner(f"stopping zllm (pid {state.pid})"):
        stopped = wait_until_released(settings.pid_file, timeout)
    if not stopped and force:
        os.kill(state.pid, signal.SIGKILL)
        stopped = wait_until_released(settings.pid_file, 10.0)
        if stopped:
            probe(settings.pid_file, settings.control_socket)  # a killed daemon leaves its files: clean them
    if not stopped:
        fail(f"the daemon (pid {state.pid}) is still running after {timeout:.0f}s",
             hint="zllm stop --force kills it", code=EXIT_USER)
    err.print(f"zllm stopped (pid {state.pid})")
    return True


@_with_serve_options
def restart(
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for each of stop and start."),
    **serve_options,
) -> None:
    """Stop the daemon (if running) and start it again with the same flags as before, plus any given here."""
    settings = settings_or_fail()
    flags: dict[str, object] = {**remembered_flags(settings),
                                **{k: v for k, v in serve_options.items() if v is not None}}
    _stop(settings, timeout, force=False)
    _start(flags, timeout)


def _probe(settings: Settings) -> PidState:
    state = probe(settings.pid_file, settings.control_socket)
    if state.stale:
        who = f" (pid {state.pid})" if state.pid else ""
        err.print(f"removed a stale pid file and socket left by a daemon that died{who}")
    return state


class Spinner:
    """A status line with a spinner on a terminal; nothing elsewhere (progress only on a TTY)."""

    def __init__(self, message: str):
        self._status = err.status(message) if err.is_terminal else None

    def __enter__(self):
        if self._status is not None:
            self._status.__enter__()
        return lambda message: self._status.update(message) if self._status is not None else None

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


# ---------------------------------------------------------------------- status / logs


def status(as_json: bool = typer.Option(False, "--json", help="Print the status as JSON.")) -> None:
    """Show whether the daemon runs, its model, address, uptime and queue. Exit status 3 when none runs."""
    settings = settings_or_fail()
    with daemon_errors(settings):  # nothing answers: exit 3 (a stale pid file is cleaned and reported)
        try:
            current = connect(settings, timeout=5.0).status()
        except DaemonUnreachable:
            if as_json:
                print_json({"running": False})
            raise
    if as_json:
        print_json({"running": True, **current.to_json()})
        return
    _print_status(current)


def _print_status(current: DaemonStatus) -> None:
    sys.stdout.write(f"zllm {current.version} is {current.phase} (pid {current.pid})\n")
    write_fields([
        ("model", current.model),
        ("api", current.http_url),
        ("uptime", human_duration(current.uptime_s)),
        ("queue", f"{current.requests_running} running, {current.requests_prefilling} prefilling, "
                  f"{current.queue_waiting} waiting (max {current.max_queue})"),
        *(("prefill", prefill_line(PrefillProgress.from_json(p))) for p in current.prefilling),
        ("socket", current.socket),
        ("data", current.data_dir),
        ("log", current.log_file),
    ])


def prefill_line(p: PrefillProgress) -> str:
    """`msg_… 4,352/18,749 prompt tokens (23%), 0 from the cache`."""
    share = f" ({100 * p.prefilled_tokens // p.prompt_tokens}%)" if p.prompt_tokens else ""
    return (f"{p.request_id} {p.prefilled_tokens:,}/{p.prompt_tokens:,} prompt tokens{share}, "
            f"{p.cached_tokens:,} from the cache")


def logs(
    lines: int = typer.Option(100, "--lines", "-n", help="How many recent lines to show."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until Ctrl-C."),
) -> None:
    """Show the daemon's log: over the control socket, or from the log file when no daemon runs."""
    settings = settings_or_fail()
    if follow:
        ctrl_c_ends_the_follow()
    try:
        with daemon_errors(settings):
            try:
                for line in connect(settings, timeout=5.0).logs(last=lines, follow=follow):
                    _print_line(line)
                return
            except DaemonUnreachable:
                pass
        _logs_from_file(settings, lines, follow)
    except KeyboardInterrupt:
        return


def _logs_from_file(settings: Settings, lines: int, follow: bool) -> None:
    path = settings.log_file
    if not path.exists():
        fail("zllm is not running and has no log file yet", hint=f"expected at {path}; start it: zllm start",
             code=EXIT_UNREACHABLE)
    err.print(f"zllm is not running; the log of its last background run ({path}):")
    with open(path, "rb") as f:
        for line in f.read().decode(errors="replace").splitlines()[-lines:] if lines else []:
            _print_line(line)
        while follow:  # `tail -f`: a daemon started later appends here
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            else:
                time.sleep(0.25)


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
