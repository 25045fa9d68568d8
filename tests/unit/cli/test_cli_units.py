"""Durations and sizes as people type and read them."""

from __future__ import annotations

import pytest

from zllm.cli.units import (
    human_count,
    human_duration,
    human_size,
    parse_duration,
    parse_size,
    percent,
)
from zllm.errors import InvalidRequest


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200),
                                                ("1.5d", 129600), ("1w", 604800), (" 3 H ", 10800)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [("0", 0), ("500MB", 500_000_000), ("2GiB", 2 << 30), ("1.5G", 1_500_000_000),
                                             ("10k", 10_000), ("4 KiB", 4096), ("7b", 7)])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "soon", "-1h", "2y", "1e3"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        parse_duration(text)
    assert "30m, 2h, 7d" in bad.value.hint


@pytest.mark.parametrize("text", ["big", "-5MB", "5 MBs", "1.2.3G"])
def test_bad_sizes_say_how_to_write_one(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_size(text)


def test_people_readable_numbers() -> None:
    assert [human_size(n) for n in (0, 999, 1000, 4_938_268, 2_100_000_000)] == [
        "0 B", "999 B", "1.0 KB", "4.9 MB", "2.1 GB"]
    assert [human_duration(s) for s in (0, 45, 192, 7500, 277200)] == ["0s", "45s", "3m12s", "2h05m", "3d05h"]
    assert [human_count(n) for n in (412, 950_000, 1_234_567, 135_000_000, 1_200_000_000)] == [
        "412", "950K", "1.2M", "135M", "1.2B"]
    assert (percent(None), percent(0.256)) == ("-", "26%")
