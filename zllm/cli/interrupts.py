"""Ctrl-C ends a follow (`zllm trace`, `zllm logs -f`) promptly, whatever the process inherited.

A follow has no other way to end, and twice in CI a Ctrl-C did not end one within 150 s (the live table once, then
`trace --json`), never reproduced by hand. Two things can keep it waiting for the daemon's next report forever:
- a process started in the background by a non-interactive shell (`cmd &` in a script) inherits SIGINT as
  ignored, and Python then installs no KeyboardInterrupt handler: the follow takes SIGINT back;
- the unwinding after the interrupt stalls (a stream lock, the socket file): SIGALRM ends the process
  EXIT_GRACE_S later, with status 0 as a clean stop does. A normal exit comes first and takes the alarm with it.
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_GRACE_S = 5


def ctrl_c_ends_the_follow(restore: bytes = b"") -> None:
    """SIGINT raises KeyboardInterrupt here and arms the backstop; `restore` is written to the terminal if the
    backstop fires (the live table hides the cursor). Main thread only: signal's rule."""
    def interrupted(signum, frame) -> None:
        # os.write, not sys.stdout: a stalled unwinding may hold the stream's lock
        signal.signal(signal.SIGALRM, lambda *_: (os.write(1, restore) if restore else None, os._exit(0)))
        signal.alarm(EXIT_GRACE_S)
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupted)
