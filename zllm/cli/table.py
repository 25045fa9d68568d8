"""Plain aligned columns on stdout (like `ollama list`): readable in a terminal, greppable in a pipe."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def write_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        sys.stdout.write("   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")


def write_fields(pairs: Sequence[tuple[str, str]]) -> None:
    """`name   value` lines, names aligned (status, stats)."""
    width = max((len(name) for name, _ in pairs), default=0)
    for name, value in pairs:
        sys.stdout.write(f"{name.ljust(width)}   {value}\n")
