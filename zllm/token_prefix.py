"""The one prefix-length helper: how many leading items two sequences share — token ids (tuples, lists, packed
bytes) or text. A leaf any layer may import (the prefix cache, the SSD index, diagnosis, the prompt encoder)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence | bytes | str, b: Sequence | bytes | str) -> int:
    """Length of the longest common prefix. Slice compares run in C, so this is O(n log n) memcmp, not a Python
    loop. Two sequences of different types (a list and a tuple) are compared item by item as tuples: a list slice
    never equals a tuple slice."""
    if type(a) is not type(b):
        a, b = tuple(a), tuple(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
