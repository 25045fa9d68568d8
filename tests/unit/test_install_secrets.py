"""The install's secrets: one root made once, owner-only, the same on every later start; a key per purpose
derived from it; the per-purpose files an older zllm wrote kept as those purposes' keys; damaged files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zllm.install_secrets import ROOT_FILE, derive, load_install_secrets
from zllm.store import StoreError


def test_the_root_is_made_once_owner_only_and_each_purpose_gets_its_own_key(tmp_path: Path) -> None:
    state = tmp_path / "state"
    keys = load_install_secrets(state)
    root = (state / ROOT_FILE).read_bytes()
    assert len(root) == 32 and stat.S_IMODE((state / ROOT_FILE).stat().st_mode) == 0o600
    assert (keys.namespace, keys.compaction) == (derive(root, "namespace"), derive(root, "compaction"))
    assert len({keys.namespace, keys.compaction, root}) == 3
    assert load_install_secrets(state) == keys  # what a restarted daemon reads
    assert load_install_secrets(tmp_path / "other") != keys
    assert sorted(os.listdir(state)) == [ROOT_FILE]  # a new install writes no per-purpose file
    assert keys.namespace.hex() not in repr(keys)


def test_an_older_install_keeps_its_namespace_salt_and_compaction_key(tmp_path: Path) -> None:
    """Both files as the zllm before this one wrote them: namespaces and compaction items stay valid."""
    salt, compaction = os.urandom(32), os.urandom(32)
    (tmp_path / "namespace.secret").write_text(salt.hex() + "\n", encoding="ascii")
    (tmp_path / "install.key").write_bytes(compaction)
    keys = load_install_secrets(tmp_path)
    assert (keys.namespace, keys.compaction) == (salt, compaction)
    assert load_install_secrets(tmp_path) == keys


def test_a_damaged_namespace_salt_gives_way_to_the_derived_key(tmp_path: Path) -> None:
    (tmp_path / "namespace.secret").write_text("not hex\n", encoding="ascii")
    keys = load_install_secrets(tmp_path)
    assert keys.namespace == derive((tmp_path / ROOT_FILE).read_bytes(), "namespace")


@pytest.mark.parametrize("name", [ROOT_FILE, "install.key"])
def test_a_damaged_key_file_is_an_error_with_a_hint(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"short")
    with pytest.raises(StoreError) as caught:
        load_install_secrets(tmp_path)
    assert "is not a zllm install" in caught.value.message and "delete it" in caught.value.hint
