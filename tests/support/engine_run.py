"""One request through a started engine loop, to its end: the events it sent, and the loop idle again (its
terminal state handed to the cache). Shared by the runtime tests that drive EngineLoop directly."""

from __future__ import annotations

import threading
import time

from zllm.canonical import Finished
from zllm.runtime.engine_loop import EngineLoop, EngineRequest


def run_to_the_end(engine: EngineLoop, **request) -> list:
    """Start `engine`, submit EngineRequest(request_id="r", sink=..., **request), wait for its Finished event and
    for the loop to let the request go (the terminal state is kept after the Finished event); the caller shuts
    the engine down."""
    events, done = [], threading.Event()

    def sink(event) -> None:
        events.append(event)
        if isinstance(event, Finished):
            done.set()

    engine.start()
    engine.submit(EngineRequest(request_id="r", sink=sink, **request))
    assert done.wait(60)
    while engine._live:
        time.sleep(0.01)
    return events
