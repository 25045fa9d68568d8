"""Each backend gives the runtime one object (engine/loaded.py) that answers the same questions: the same tiny
model on torch and on llama.cpp states the same facts, so nothing above the backends needs to ask which one it
is. Only where they must differ (the KV identity, drafting, what counts as running out of memory) they do."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.backends import BACKENDS, load_tiny
from zllm.engine.loaded import LoadedModel
from zllm.errors import ConfigError
from zllm.runtime.prefix import served_model_key


@pytest.fixture(scope="module")
def both():
    loaded = {}
    for param in BACKENDS:
        backend = getattr(param, "values", (param,))[0]
        try:
            loaded[backend] = load_tiny("qwen3", backend)
        except ImportError:
            pass
    yield loaded
    for model in loaded.values():
        model.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_object_states_the_models_facts(both, backend: str) -> None:
    loaded = both[backend]
    assert isinstance(loaded, LoadedModel) and loaded.backend == backend
    assert loaded.engine.backend == backend  # the step-level seam it serves through
    assert loaded.text_config.eos_token_id is not None and loaded.generation_eos == [151645, 151643]
    assert loaded.vocab_size == 151936 and loaded.context_length == 512
    weights = loaded.weights()
    assert (weights.architecture, weights.parameters) == ("Qwen3ForCausalLM", 9798016)
    assert weights.model_bytes >= 4 * weights.parameters  # float32 weights
    assert loaded.device_cache_budget(16) > 0 and str(loaded.device) == "cpu"


def test_the_two_backends_keep_apart_in_the_cache_identity(both) -> None:
    if len(both) < 2:
        pytest.skip("llama-cpp-python is not installed")
    # the first backend's identities carried no backend name: SSD tiers on disk stay valid
    assert both["torch"].cache_dtype == "float32" and both["llamacpp"].cache_dtype == "llamacpp:F32"
    assert served_model_key(both["torch"]) != served_model_key(both["llamacpp"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_draft_model_runs_on_both_backends_and_is_refused_where_none_can_verify_one(both, backend: str) -> None:
    both[backend].check_draft_model()  # torch and llama.cpp verify a draft model's proposals
    with pytest.raises(ConfigError, match="--draft-model does not run on the other backend"):
        LoadedModel.check_draft_model(SimpleNamespace(backend="other"))  # the base: a backend that cannot


def test_only_the_device_running_out_is_out_of_memory(both) -> None:
    import torch

    assert both["torch"].out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not any(model.out_of_memory(RuntimeError("boom")) for model in both.values())
