"""The one prefix-length helper (zllm/token_prefix.py) on every kind of sequence its callers hand it."""

import pytest

from zllm.token_prefix import common_prefix_length


@pytest.mark.parametrize("a, b, want", [
    ([1, 2, 3, 4], (1, 2, 9), 2),  # a list and a tuple: a list slice never equals a tuple slice
    ([5, 6], (5, 6, 7), 2),
    ("hello world", "hello there", 6), ("", "abc", 0),
    ([1, 2, 3], [1, 2, 3], 3), (b"\x01\x02", b"\x01\x03", 1),
])
def test_any_two_sequences(a, b, want) -> None:
    assert common_prefix_length(a, b) == want == common_prefix_length(b, a)
