"""Token-sequence prefix comparison, torch-free (both prefix caches and the SSD index use it)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int] | bytes, b: Sequence[int] | bytes) -> int:
    """Length of the longest common prefix; slice compares run in C, so this is O(n log n) memcmp, not a loop."""
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
