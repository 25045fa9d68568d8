"""This install's secret key: 32 random bytes in a file of the state dir, made on first use, readable by the
owner only. It signs what zllm hands a client to give back later and must trust then (the `compaction`
items of the Responses API): a forged or edited one fails the check. The file outlives the daemon, so an
item made before a restart still opens after it.

    key = load_or_create_key(state_dir / "install.key")
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from zllm.store.responses import StoreError

KEY_BYTES = 32


def load_or_create_key(path: Path) -> bytes:
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        return _create(path)
    if len(key) != KEY_BYTES:
        raise StoreError(f"{path} is not a zllm install key ({len(key)} bytes, expected {KEY_BYTES})",
                         hint="delete it to make a new one (compaction items signed with the old key stop opening)")
    return key


def _create(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    try:
        # O_EXCL: two daemons starting at once must not each write their own key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load_or_create_key(path)
    with os.fdopen(fd, "wb") as file:
        file.write(key)
    return key
