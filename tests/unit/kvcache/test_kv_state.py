"""KV state helpers: layout checks, real byte counting, prefix length."""

import pytest
import torch

from tests.unit.kvcache.conftest import LAYOUT, synthetic_state
from zllm.engine.torch.cache.state import clone_state, common_prefix_length, slice_state, state_tensors, storage_bytes


def test_layout_bytes_per_token_matches_the_tensors() -> None:
    state = synthetic_state(range(10))
    assert LAYOUT.check(state) == 10
    assert LAYOUT.bytes_per_token * 10 == sum(t.nbytes for t in state_tensors(state)) == 10 * 512


def test_layout_rejects_mismatched_states() -> None:
    state = synthetic_state(range(4))
    with pytest.raises(ValueError):
        LAYOUT.check(state[:1])
    with pytest.raises(ValueError):
        LAYOUT.check(((state[0][0], state[0][1][..., :3, :]), state[1]))
    with pytest.raises(ValueError):
        LAYOUT.check(((state[0][0].double(), state[0][1]), state[1]))


def test_storage_bytes_counts_each_storage_once_and_whole() -> None:
    big = torch.zeros(1, 2, 100, 16)
    view = big[..., :10, :]
    assert storage_bytes([big, view]) == big.nbytes  # a view does not count twice
    assert storage_bytes([view]) == big.nbytes  # ...and pins the whole storage
    assert storage_bytes(state_tensors(clone_state(slice_state(synthetic_state(range(100)), 0, 10)))) == 10 * 512


@pytest.mark.parametrize("a, b, want", [
    ((), (1,), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2), 2), ((1, 2, 3), (1, 5, 3), 1),
    (tuple(range(1000)), tuple(range(999)) + (7,), 999), (b"abcdef", b"abcxef", 3),
])
def test_common_prefix_length(a, b, want) -> None:
    assert common_prefix_length(a, b) == want == common_prefix_length(b, a)
