"""Each backend's KV (engine/torch/cache/kv.py, engine/llamacpp/kv.py) has the shape of the one interface the prefix
cache asks of it (kvcache/kv_interface.py): every member, with the interface's parameters."""

import pytest

from tests.unit.kvcache.test_cache_contract import shape_mismatches
from zllm.engine.llamacpp.kv import LlamaKV
from zllm.kvcache.kv_interface import KVSequences


def torch_kv():
    pytest.importorskip("torch")
    from zllm.engine.torch.cache.kv import TorchKV

    return TorchKV


@pytest.mark.parametrize("which", ["torch", "llamacpp"])
def test_each_backends_kv_has_the_interfaces_shape(which) -> None:
    kv = torch_kv() if which == "torch" else LlamaKV
    assert shape_mismatches(KVSequences, kv) == []
    assert {"bytes_per_token", "shares_prefixes"} <= set(KVSequences.__annotations__)
    assert isinstance(kv.shares_prefixes, bool)
