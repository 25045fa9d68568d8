"""This install's secrets: one random root key in the state dir, and from it one key per purpose.

    secrets = load_install_secrets(state_dir)   # state_dir/install.secret: 32 random bytes, 0600, made once
    secrets.namespace     # salts namespace ids (api/auth.py); the SSD tier and the Responses store file rows
                          # under those ids, so it must not change across restarts
    secrets.compaction    # signs Responses `compaction` items (api/openai_responses/compaction_seal.py): an item
                          # made before a restart must still open after it

A purpose's key is HMAC-SHA256(root, purpose): one key that leaks (a namespace id brute-forced, say) tells
nothing of the root or of another purpose's key, and a new purpose needs no new file.

An older zllm kept one file per purpose (`namespace.secret` in hex, `install.key` as raw bytes). Where one
is there it stays that purpose's key, so an upgraded install keeps its namespaces (warm SSD cache, stored
responses still reachable) and its compaction items; a new install writes neither file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from zllm.private_files import private_dir
from zllm.store import StoreError

ROOT_FILE = "install.secret"
ROOT_BYTES = 32
LEGACY_NAMESPACE_FILE = "namespace.secret"  # hex text; a damaged one was replaced by a new salt
LEGACY_COMPACTION_FILE = "install.key"  # raw bytes; a damaged one was an error
# every file of this module's, for the daemon's start-up tightening (daemon.make_private)
FILES = (ROOT_FILE, LEGACY_NAMESPACE_FILE, LEGACY_COMPACTION_FILE)


@dataclass(frozen=True, repr=False)  # repr=False: a key must not reach a log through a stray print
class InstallSecrets:
    namespace: bytes
    compaction: bytes


def load_install_secrets(state_dir: Path) -> InstallSecrets:
    """This install's keys, the root made on first use. Raises StoreError for a damaged key file."""
    state_dir = private_dir(state_dir)
    root = _load_or_create_root(state_dir / ROOT_FILE)
    return InstallSecrets(
        namespace=_legacy_namespace(state_dir / LEGACY_NAMESPACE_FILE) or derive(root, "namespace"),
        compaction=_legacy_compaction(state_dir / LEGACY_COMPACTION_FILE) or derive(root, "compaction"),
    )


def derive(root: bytes, purpose: str) -> bytes:
    return hmac.new(root, b"zllm install secret\0" + purpose.encode(), hashlib.sha256).digest()


def _load_or_create_root(path: Path) -> bytes:
    try:
        root = path.read_bytes()
    except FileNotFoundError:
        return _create_root(path)
    if len(root) != ROOT_BYTES:
        raise StoreError(
            f"{path} is not a zllm install secret ({len(root)} bytes, expected {ROOT_BYTES})",
            hint="delete it to make a new one (the SSD cache then starts cold, stored responses "
            "and compaction items made with the old one stop opening)",
        )
    return root


def _create_root(path: Path) -> bytes:
    root = secrets.token_bytes(ROOT_BYTES)
    try:
        # O_EXCL: two daemons starting at once must not each write their own root
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _load_or_create_root(path)
    with os.fdopen(fd, "wb") as file:
        file.write(root)
        file.flush()
        os.fsync(file.fileno())
    return root


def _legacy_namespace(path: Path) -> bytes | None:
    """An older install's namespace salt; None when there is none or it is damaged (as it was then, a new salt
    costs only cold caches and unreachable old rows)."""
    try:
        salt = bytes.fromhex(path.read_text(encoding="ascii").strip())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return salt if len(salt) >= 16 else None


def _legacy_compaction(path: Path) -> bytes | None:
    """An older install's compaction key; a damaged one is an error, as it was then."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(key) != ROOT_BYTES:
        raise StoreError(
            f"{path} is not a zllm install key ({len(key)} bytes, expected {ROOT_BYTES})",
            hint="delete it to make a new one (compaction items signed with the old key stop opening)",
        )
    return key
