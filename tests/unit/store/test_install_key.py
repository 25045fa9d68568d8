"""The install key: made once, owner-only, the same on every later start; a damaged file is an error."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from zllm.store import StoreError
from zllm.store.install_key import KEY_BYTES, load_or_create_key


def test_the_key_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "install.key"
    key = load_or_create_key(path)
    assert len(key) == KEY_BYTES and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path) == key  # what a restarted daemon reads
    assert load_or_create_key(tmp_path / "other.key") != key


def test_a_damaged_key_file_is_an_error_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "install.key"
    path.write_bytes(b"short")
    with pytest.raises(StoreError) as caught:
        load_or_create_key(path)
    assert "not a zllm install key" in caught.value.message and "delete it" in caught.value.hint
