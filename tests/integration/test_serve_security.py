"""A real `zllm serve` under a careless umask with several keys: namespaces follow the verified key (and survive
a restart), everything it writes about requests is private, and a foreign Host is refused."""

from __future__ import annotations

import contextlib
import http.client
import os
import stat
from pathlib import Path

import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon

ALICE, BOB = "alice-key", "bob-key"


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def start(tiny_data_dir: Path, root: Path) -> Daemon:
    """The daemon inherits umask 000: whatever it creates would be world-writable if it did not see to it."""
    keys = root / "keys"
    keys.write_text(f"# team keys\n{ALICE}\n{BOB}\n")
    with umask(0):
        return Daemon(tiny_data_dir, TINY, "--api-keys-file", str(keys), "--context-length", "192",
                      env={"ZLLM_STATE_DIR": str(root / "state")}).wait_ready()


def client(daemon: Daemon, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=key, max_retries=0, timeout=60,
                         default_headers=headers or None)


def world_or_group_accessible(*roots: Path) -> list[str]:
    loose = []
    for root in roots:
        for path in (root, *root.rglob("*")):
            if stat.S_IMODE(path.lstat().st_mode) & 0o077:
                loose.append(f"{path} {oct(stat.S_IMODE(path.lstat().st_mode))}")
    return loose


def test_keys_namespaces_files_and_hosts(tiny_data_dir, tmp_path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "zllm.log").write_text("an older daemon's log\n")
    os.chmod(state / "zllm.log", 0o644)
    daemon = start(tiny_data_dir, tmp_path)
    try:
        stored = client(daemon, ALICE).responses.create(model=TINY, input="hi", store=True, max_output_tokens=4)
        # Bob's key cannot read Alice's response; Alice's key with any Bearer next to it still can
        with pytest.raises(openai.NotFoundError):
            client(daemon, BOB).responses.retrieve(stored.id)
        assert client(daemon, "not-a-key", **{"x-api-key": ALICE}).responses.retrieve(stored.id).id == stored.id
        with pytest.raises(openai.AuthenticationError):
            client(daemon, "not-a-key").models.list()

        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        connection.request("GET", "/v1/models", headers={"Host": "attacker.example", "x-api-key": ALICE})
        assert connection.getresponse().status == 403
        connection.close()

        assert world_or_group_accessible(state, daemon.scratch / "run", daemon.scratch / "cache") == []
        assert {p.name for p in state.iterdir()} >= {"responses.sqlite3", "install.secret", "zllm.log"}
        assert stat.S_ISSOCK(daemon.control_socket.lstat().st_mode)
    finally:
        assert daemon.stop() == 0, daemon.log()
    restarted = start(tiny_data_dir, tmp_path)  # the same install secret: the same namespaces
    try:
        assert client(restarted, ALICE).responses.retrieve(stored.id).id == stored.id
        assert "Traceback" not in restarted.log()
    finally:
        restarted.stop()
