"""Durations and sizes as people type and read them: `--older-than 2h`, `--max-size 500MB`, "3m12s", "4.2 MB"."""

from __future__ import annotations

import re

from zllm.errors import InvalidRequest

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_BYTES = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "15m", "2h", "7d", "1w"."""
    match = _DURATION.match(text)
    if match is None:
        raise InvalidRequest(f"`{text}` is not a duration", hint="use a number with s, m, h, d or w: 30m, 2h, 7d")
    return float(match[1]) * _SECONDS[(match[2] or "s").lower()]


def parse_size(text: str) -> int:
    """Bytes in "500MB", "2GiB", "1.5G", "0"; decimal units unless written with an i."""
    match = _SIZE.match(text)
    if match is None:
        raise InvalidRequest(f"`{text}` is not a size", hint="use a number with B, KB, MB, GB or KiB, MiB, GiB")
    unit = (match[2] or "").lower().removesuffix("b")
    return int(float(match[1]) * _BYTES[unit])


def human_size(size: int | float) -> str:
    """Decimal units, like `ollama list` and download sizes on the hub."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """The two largest units: 45s, 3m12s, 2h05m, 3d04h."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def human_count(n: int) -> str:
    """Parameters and token counts: 135M, 1.2B, 950K, 412."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"
