"""`zllm store stats / prune` against a real ResponseStore behind real control methods on a real socket."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.unit.control.test_cli_over_socket import env, zllm  # noqa: F401  (env is a fixture)
from zllm import __version__
from zllm.canonical import Message
from zllm.control.methods import ControlMethods, DaemonFacts
from zllm.runtime.trace import LogHub, TraceHub
from zllm.store import ResponseStore, StoredResponse


def stored(n: int) -> StoredResponse:
    return StoredResponse(id=f"resp_{n}", namespace="ns", created_at=time.time(),
                          input_messages=(Message("user", os.urandom(20_000).hex()),), output_messages=())


@pytest.fixture()
def store(tmp_path):
    clock = type("Clock", (), {"now": time.time(), "__call__": lambda self: self.now})()
    store = ResponseStore(tmp_path / "responses.sqlite3", max_bytes=1 << 30, clock=clock)
    for n in range(5):
        store.save(stored(n))
        clock.now += 86400  # a day apart: resp_0 is 5 days old, resp_4 one day old
    yield store
    store.close()


@pytest.fixture()
def daemon_with_store(env, serve, loop_thread, store):  # noqa: F811
    facts = DaemonFacts(version=__version__, pid=4242, started_at=time.time(), model="tiny", http_url="http://x/v1",
                        host="127.0.0.1", port=1, socket="s", data_dir="d", log_file="l", max_queue=8)
    control = ControlMethods(facts, trace=TraceHub(loop_thread.loop), logs=LogHub(loop_thread.loop).ring,
                             request_shutdown=lambda: None)
    control.attach_responses(store)
    serve(control.methods(), control.streams(), version=__version__)
    return store


def test_store_stats_shows_rows_bytes_and_bounds(daemon_with_store, capsys) -> None:
    code, out, _ = zllm(capsys, "store", "stats", "--json")
    data = json.loads(out)
    assert code == 0 and data["rows"] == 5 and data["bytes"] > 5 * 20_000 and data["max_bytes"] == 1 << 30
    code, out, _ = zllm(capsys, "store", "stats")
    assert code == 0 and "5 responses" in out and "bound 1.1 GB" in out and "on disk" in out


def test_store_prune_by_age_then_size_then_all(daemon_with_store, capsys) -> None:
    code, _, err = zllm(capsys, "store", "prune", "--older-than", "3d")
    assert code == 0 and err.startswith("removed 2 responses; 3 left")
    assert daemon_with_store.load("resp_1", "ns") is None and daemon_with_store.load("resp_2", "ns") is not None
    code, out, _ = zllm(capsys, "store", "prune", "--max-size", "30KB", "--json")
    assert code == 0 and json.loads(out)["rows"] == 1 and daemon_with_store.load("resp_4", "ns") is not None
    code, _, err = zllm(capsys, "store", "prune", "--all")
    assert code == 0 and err.startswith("removed 1 responses; 0 left")


def test_store_prune_needs_a_criterion(daemon_with_store, capsys) -> None:
    code, out, err = zllm(capsys, "store", "prune")
    assert (code, out) == (1, "") and err.startswith("error: nothing to prune by")
