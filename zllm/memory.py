"""Give freed heap memory back to the OS (glibc's `malloc_trim`), where the C library can.

glibc keeps what a process frees for reuse, per thread arena: after a burst of big request bodies the
daemon's RSS stays well above where it started (`malloc_trim(0)` brings it back below the start), memory
other programs on the machine could use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("zllm.memory")


@functools.cache
def _malloc_trim():
    # find_library needs ldconfig (or a compiler), which slim containers lack: glibc's soname then
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def trim() -> bool:
    """Release the free pages of every malloc arena; False where the C library has no `malloc_trim`."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True
