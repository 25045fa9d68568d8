"""`--cache-type` (issue 26): the setting's values and where it is refused, before any model loads. The cells it
gives, the cache identity and restore ≡ prefill on Q8_0 cells: tests/integration/test_llamacpp_cache_type.py."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tests.support.tiny_models import tiny_qwen_dir
from zllm.cli.app import app
from zllm.cli.ps import _row
from zllm.config import Settings, resolve_settings
from zllm.control.protocol import LoadedModelInfo
from zllm.engine.select import load_for_backend
from zllm.errors import ConfigError

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def test_the_setting_takes_auto_f16_and_q8_0_from_flag_env_and_default(tmp_path) -> None:
    env = {"ZLLM_CONFIG": str(tmp_path / "absent.toml")}
    (tmp_path / "absent.toml").write_text("")
    assert Settings().cache_type == "auto"
    assert resolve_settings({**env, "ZLLM_CACHE_TYPE": "q8_0"}).settings.cache_type == "q8_0"
    assert resolve_settings({**env, "ZLLM_CACHE_TYPE": "q8_0"}, cache_type="f16").settings.cache_type == "f16"
    assert Settings(cache_type="q8_0", exact_cache=True).cache_type == "q8_0"  # exact's own cells
    with pytest.raises(ConfigError, match="auto, f16 or q8_0, not 'q4_0'"):
        Settings(cache_type="q4_0")


def test_f16_with_exact_cache_is_refused_rather_than_either_ignored() -> None:
    with pytest.raises(ConfigError, match="exact answers need Q8_0") as refused:
        Settings(cache_type="f16", exact_cache=True)
    assert "--exact-cache implies q8_0" in refused.value.hint
    result = CliRunner().invoke(app, ["serve", "--cache-type", "f16", "--exact-cache"],
                                env={"ZLLM_CONFIG": "", "COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 1 and "--cache-type f16 cannot serve --exact-cache" in result.output


def test_torch_refuses_a_cache_type_before_loading() -> None:
    with pytest.raises(ConfigError, match="--cache-type q8_0 sets llama.cpp's KV cells; this model runs on torch"):
        load_for_backend(tiny_qwen_dir(), backend="auto", device="cpu", cache_type="q8_0")


def test_vllm_points_to_its_own_kv_cache_dtype(tmp_path) -> None:
    from zllm.engines import open_engine

    (tmp_path / "config.json").write_text("{}")
    served = SimpleNamespace(name="m", path=tmp_path, created=0)
    with pytest.raises(ConfigError, match="not vLLM's") as refused:
        asyncio.run(open_engine(Settings(backend="vllm", cache_type="q8_0"), served))
    assert "--kv-cache-dtype" in refused.value.hint


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_q8_0_is_refused_on_heads_its_blocks_cannot_hold() -> None:
    from tests.support.backends import tiny_gguf_model_dir
    from zllm.engine.llamacpp.loader import load_gguf_model

    with pytest.raises(ConfigError, match="not a multiple of 32 wide") as refused:
        load_gguf_model(tiny_gguf_model_dir("qwen3"), threads=1, exact_cache=False, cache_type="q8_0")  # 16 wide
    assert "--cache-type f16" in refused.value.hint


def test_ps_shows_the_cells_type_beside_the_kv_cache() -> None:
    info = LoadedModelInfo(name="m", kv_cache_bytes=1 << 20, kv_cache_budget_bytes=4 << 20, kv_cache_type="q8_0")
    assert _row(info)[8] == "1.0 MB / 4.2 MB q8_0"
    assert LoadedModelInfo.from_json(info.to_json()).kv_cache_type == "q8_0"
    assert _row(LoadedModelInfo(name="m", kv_cache_bytes=1 << 20))[8] == "1.0 MB"  # torch: the model's dtype
